/*
 * bench_report.c — `mlafuse bench`'s output: the table's header and rows, or one JSON object.
 */
#include "bench_op.h"

/* "moe_gate_hash" for --hash rows, else the op's name. */
static const char *row_op_name(const row *r) {
    return r->hash && r->op == MLAF_OP_MOE_GATE ? "moe_gate_hash" : mlaf_op_name(r->op);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_num(const char *key, double v, int comma) {
    printf("\"%s\": ", key);
    if (isfinite(v))
        printf("%.6g", v);
    else
        printf("null");
    if (comma) printf(", ");
}

void print_json(const char *backend, const char *device, int threads, const char *model,
                       mlaf_dtype dt, int cache_order, const cache_opt *co, double copy_gbps,
                       double copy_bytes, const row *rows, int nrows) {
    printf("{\"tool\": \"mlafuse bench\", \"version\": \"%s\", \"backend\": ", mlaf_version_string());
    json_str(backend);
    printf(", \"device\": ");
    json_str(device);
    printf(", \"threads\": %d, \"preset\": ", threads);
    json_str(model);
    printf(", \"dtype\": \"%s\", \"cache_order\": \"%s\", ", mlaf_dtype_name(dt), cache_order_names[cache_order]);
    json_num("copy_gbps", copy_gbps, 1);
    json_num("copy_bytes", copy_bytes, 0);
    printf(", \"rows\": [");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        double nan = NAN;
        printf("%s\n  {\"op\": \"%s\", \"preset\": ", i ? "," : "", row_op_name(r));
        json_str(r->model);
        printf(", \"T\": %lld, \"mode\": \"%s\", ", (long long)r->T, r->mode);
        if (co->show) { /* the cache format of mla_kv_cache rows; null on the other ops' rows */
            printf("\"cache\": ");
            if (r->cache) json_str(r->cache);
            else printf("null");
            printf(", \"tile_scale\": ");
            if (r->cache && (mlaf_kv_formats[co->fmt].flags & MLAF_KVF_TILE_SCALE)) json_str(tile_scale_names[co->tile_scale]);
            else printf("null");
            printf(", ");
            json_num("kv_scale", r->cache && (mlaf_kv_formats[co->fmt].flags & MLAF_KVF_SCALE) ? co->kv_scale : NAN, 1);
        }
        json_num("calls_per_sample", r->have_fused ? r->fused.calls_per_sample : nan, 1);
        json_num("samples", r->have_fused ? r->fused.samples : nan, 1);
        json_num("fused_us", r->have_fused ? r->fused.median_us : nan, 1);
        json_num("fused_p10_us", r->have_fused ? r->fused.p10_us : nan, 1);
        json_num("fused_p90_us", r->have_fused ? r->fused.p90_us : nan, 1);
        json_num("fused_min_us", r->have_fused ? r->fused.min_us : nan, 1);
        json_num("fused_max_us", r->have_fused ? r->fused.max_us : nan, 1);
        json_num("bytes", r->bytes, 1);
        json_num("gbps", r->gbps, 1);
        json_num("copy_gbps", copy_gbps, 1);
        json_num("pct_of_copy", r->pct, 1);
        json_num("same_bytes_copy_us", r->have_scopy ? r->scopy.median_us : nan, 1);
        json_num("pct_of_same_bytes_copy", r->pct_scopy, 1);
        json_num("kernel_copy_us", r->have_kcopy ? r->kcopy.median_us : nan, 1);
        json_num("pct_of_kernel_copy", r->pct_kcopy, 1);
        json_num("unfused_us", r->have_unfused ? r->unfused.median_us : nan, 1);
        json_num("unfused_p10_us", r->have_unfused ? r->unfused.p10_us : nan, 1);
        json_num("unfused_p90_us", r->have_unfused ? r->unfused.p90_us : nan, 1);
        json_num("speedup", r->speedup, 0);
        printf(", \"baseline_check\": ");
        json_str(r->check);
        printf(", \"error\": ");
        if (r->error[0])
            json_str(r->error);
        else
            printf("null");
        printf("}");
    }
    printf("\n]}\n");
}

void print_header(int show_cache) {
    if (show_cache) printf("%-14s %-10s ", "op", "cache");
    else printf("%-14s ", "op");
    printf("%-18s %8s %-6s %10s %21s %9s %8s %6s %9s %6s %9s %6s %11s %8s  %s\n",
           "preset", "T", "mode", "fused_us", "(p10 .. p90)", "MB", "GB/s", "%copy", "copy_us",
           "%cpy=", "kcopy_us", "%kcpy=", "unfused_us", "speedup", "check");
}

void print_row(const row *r, int show_cache) {
    char f[16] = "-", band[32] = "", mb[16], gb[16] = "-", pc[16] = "-", uf[16] = "-", sp[16] = "-";
    char cu[16] = "-", cp[16] = "-", ku[16] = "-", kp[16] = "-";
    if (r->have_scopy) snprintf(cu, sizeof cu, "%.2f", r->scopy.median_us);
    if (isfinite(r->pct_scopy)) snprintf(cp, sizeof cp, "%.0f%%", r->pct_scopy);
    if (r->have_kcopy) snprintf(ku, sizeof ku, "%.2f", r->kcopy.median_us);
    if (isfinite(r->pct_kcopy)) snprintf(kp, sizeof kp, "%.0f%%", r->pct_kcopy);
    if (r->have_fused) {
        snprintf(f, sizeof f, "%.2f", r->fused.median_us);
        snprintf(band, sizeof band, "(%.2f .. %.2f)", r->fused.p10_us, r->fused.p90_us);
    }
    snprintf(mb, sizeof mb, "%.3f", r->bytes / 1e6);
    if (isfinite(r->gbps)) snprintf(gb, sizeof gb, "%.1f", r->gbps);
    if (isfinite(r->pct)) snprintf(pc, sizeof pc, "%.0f%%", r->pct);
    if (r->have_unfused) snprintf(uf, sizeof uf, "%.2f", r->unfused.median_us);
    if (isfinite(r->speedup)) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
    if (show_cache) printf("%-14s %-10s ", row_op_name(r), r->cache ? r->cache : "-");
    else printf("%-14s ", row_op_name(r));
    printf("%-18s %8lld %-6s %10s %21s %9s %8s %6s %9s %6s %9s %6s %11s %8s  %s%s%s\n",
           r->model, (long long)r->T, r->mode, f, band, mb, gb, pc, cu, cp, ku,
           kp, uf, sp, r->check,
           r->error[0] ? "  error: " : "", r->error);
    fflush(stdout);
}

void print_summary(FILE *f, const row *rows, int nrows) {
    int skipped = 0, ok = 0, no_baseline = 0, failed = 0;
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        if (!strcmp(r->check, "skipped")) {
            skipped++;
            continue;
        }
        const int check_ok = !strncmp(r->check, "ok", 2); /* "ok (N near-tie rows)" is ok */
        const int none = !strcmp(r->check, "no baseline");
        ok += check_ok;
        no_baseline += none;
        failed += r->error[0] || (!check_ok && !none);
    }
    fprintf(f, "# bench: %d row%s, %d check%s ok, %d failed (%d without a baseline, %d skipped)\n", nrows,
            nrows == 1 ? "" : "s", ok, ok == 1 ? "" : "s", failed, no_baseline, skipped);
    fflush(f);
}
