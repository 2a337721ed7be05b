/*
 * test_api.c — misuse of every entry point except moe_gate (tested with its op): NULL
 * context / params / tensors, wrong dtype, rank, shape, strides, unaligned data, overlaps
 * other than the exact in-place form, bad eps, out-of-range limits, T >= 2^31; the context
 * setters, preset lookup, mlaf_rope_table_init, status / dtype / backend names, the version.
 * Every rejected op must return the expected status, leave a message naming the argument
 * (checked by substring), and leave every buffer — outputs, inputs, guard zones — bit-identical.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

enum { T = 5, Q = 768, C = 512, R = 64, W = Q + C + R, H = 20, D = 256, MAXP = 16, NB = 4, BS = 4 };

/* ---- fixture: every buffer an op may see, on the backend, with its initial image ---------- */
enum { B_LAT, B_WQ, B_WKV, B_Q, B_KN, B_KP, B_POS, B_CS, B_SLOT, B_CACHE, B_EC, B_Q3, B_COUNT };
static const size_t BYTES[B_COUNT] = {T * W * 2, Q * 2, C * 4, T * Q * 2, T * C * 2, T * R * 2,
                                      T * 8, MAXP * R * 4, T * 8, NB * BS * (C + R) * 2, 4,
                                      T * H * D * 2};
static mlaf_gbuf G[B_COUNT];
static unsigned char *INIT[B_COUNT];
static mlaf_context *CTX;
static mlaf_backend BE;
static int SETUP_OK;

static void setup(void) {
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 99);
    SETUP_OK = 1;
    for (int i = 0; i < B_COUNT; i++) {
        INIT[i] = malloc(BYTES[i]);
        for (size_t k = 0; k < BYTES[i]; k++) INIT[i][k] = (unsigned char)(mlaf_rng_u64(&rng) >> 56);
        if (i == B_Q || i == B_KN || i == B_KP) memset(INIT[i], 0xFF, BYTES[i]); /* poisoned */
        if (i == B_POS || i == B_SLOT)
            for (int t = 0; t < T; t++) ((int64_t *)INIT[i])[t] = t;
        if (i == B_EC) memset(INIT[i], 0, 4);
        if (i == B_CS) mlaf_rope_table_init((float *)INIT[i], MAXP, R, 10000.0);
        if (i == B_LAT || i == B_WQ || i == B_Q3) mlaf_fill_normal(&rng, INIT[i], MLAF_BF16, BYTES[i] / 2, 0, 1);
        if (i == B_WKV) mlaf_fill_normal(&rng, INIT[i], MLAF_F32, BYTES[i] / 4, 1, 0.1);
        if (mlaf_gbuf_alloc(&G[i], BE, BYTES[i], INIT[i], 0) != MLAF_OK) SETUP_OK = 0;
    }
}

static void teardown(void) {
    for (int i = 0; i < B_COUNT; i++) {
        mlaf_gbuf_free(&G[i]);
        free(INIT[i]);
    }
}

/* Index of the first buffer that changed (or whose guards did), -1 when none did. */
static int first_changed(void) {
    for (int i = 0; i < B_COUNT; i++) {
        if (mlaf_gbuf_download(&G[i]) != MLAF_OK) return i;
        if (!mlaf_gbuf_guards_ok(&G[i]) || !mlaf_gbuf_equals(&G[i], INIT[i])) return i;
    }
    return -1;
}

static void *P(int i) { return G[i].ptr; }

/* Valid views of the fixture; each case copies these and breaks one thing. */
static mlaf_tensor lat(void) { return mlaf_tensor_2d(P(B_LAT), MLAF_BF16, T, W, W); }
static mlaf_tensor wq(void) { return mlaf_tensor_1d(P(B_WQ), MLAF_BF16, Q); }
static mlaf_tensor wkv(void) { return mlaf_tensor_1d(P(B_WKV), MLAF_F32, C); }
static mlaf_tensor qo(void) { return mlaf_tensor_2d(P(B_Q), MLAF_BF16, T, Q, Q); }
static mlaf_tensor kn(void) { return mlaf_tensor_2d(P(B_KN), MLAF_BF16, T, C, C); }
static mlaf_tensor kp(void) { return mlaf_tensor_2d(P(B_KP), MLAF_BF16, T, R, R); }
static mlaf_tensor pos(void) { return mlaf_tensor_1d(P(B_POS), MLAF_I64, T); }
static mlaf_tensor cs(void) { return mlaf_tensor_2d(P(B_CS), MLAF_F32, MAXP, R, R); }
static mlaf_tensor slot(void) { return mlaf_tensor_1d(P(B_SLOT), MLAF_I64, T); }
static mlaf_tensor cache(void) {
    return mlaf_tensor_3d(P(B_CACHE), MLAF_BF16, NB, BS, C + R, BS * (C + R), C + R);
}
static mlaf_tensor ec(void) { return mlaf_tensor_1d(P(B_EC), MLAF_I32, 1); }
static mlaf_tensor q3(void) { return mlaf_tensor_3d(P(B_Q3), MLAF_BF16, T, H, D, H * D, D); }

static void expect(const char *what, mlaf_status got, mlaf_status want, const char *msg_part) {
    char name[200];
    snprintf(name, sizeof name, "API(%s,backend=%s)", what, mlaf_backend_name(BE));
    mlaf_context_sync(CTX);
    int changed = first_changed();
    const char *msg = mlaf_context_last_error(CTX);
    int msg_ok = !msg_part || strstr(msg, msg_part) != NULL;
    static const char *const bufname[B_COUNT] = {"latent", "w_q", "w_kv", "q", "k_nope", "k_pe", "positions",
                                                  "cos_sin", "slot_mapping", "kv_cache", "error_count", "q3"};
    tl_case(got == want && msg_ok && changed < 0, name,
            "status %s (expected %s); message \"%s\"%s%s%s; %s%s", mlaf_status_name(got),
            mlaf_status_name(want), msg, msg_part ? " (expected to contain \"" : "",
            msg_part ? msg_part : "", msg_part ? "\")" : "",
            changed < 0 ? "buffers untouched" : "buffer changed: ", changed < 0 ? "" : bufname[changed]);
}

/* ---- split_qk_norm --------------------------------------------------------------------- */
#define SPLIT(pp, a, b, c, d, e, f) mlaf_split_qk_norm(CTX, pp, a, b, c, d, e, f)

static void split_cases(void) {
    mlaf_split_qk_norm_params p = {Q, C, R, 1e-5f, 1e-5f}, pb;
    mlaf_tensor L = lat(), WQ = wq(), WK = wkv(), QO = qo(), KN = kn(), KP = kp(), x, y;
    expect("split_qk_norm,ctx=NULL", mlaf_split_qk_norm(NULL, &p, &L, &WQ, &WK, &QO, &KN, &KP),
           MLAF_ERR_NULL_POINTER, NULL);
    expect("split_qk_norm,params=NULL", SPLIT(NULL, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_NULL_POINTER, "params is NULL");
    expect("split_qk_norm,latent=NULL", SPLIT(&p, NULL, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_NULL_POINTER, "latent is NULL");
    expect("split_qk_norm,w_q=NULL", SPLIT(&p, &L, NULL, &WK, &QO, &KN, &KP), MLAF_ERR_NULL_POINTER, "w_q is NULL");
    expect("split_qk_norm,w_kv=NULL", SPLIT(&p, &L, &WQ, NULL, &QO, &KN, &KP), MLAF_ERR_NULL_POINTER, "w_kv is NULL");
    expect("split_qk_norm,q=NULL", SPLIT(&p, &L, &WQ, &WK, NULL, &KN, &KP), MLAF_ERR_NULL_POINTER, "q is NULL");
    expect("split_qk_norm,k_nope=NULL", SPLIT(&p, &L, &WQ, &WK, &QO, NULL, &KP), MLAF_ERR_NULL_POINTER, "k_nope is NULL");
    x = L, x.dtype = MLAF_I32;
    expect("split_qk_norm,latent.dtype=i32", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_DTYPE,
           "latent.dtype = i32, expected f32, f16 or bf16");
    x = L, x.dtype = (mlaf_dtype)99;
    expect("split_qk_norm,latent.dtype=99", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_DTYPE, "latent.dtype = unknown");
    x = QO, x.dtype = MLAF_F16;
    expect("split_qk_norm,q.dtype=f16", SPLIT(&p, &L, &WQ, &WK, &x, &KN, &KP), MLAF_ERR_DTYPE, "q.dtype = f16, expected bf16");
    x = WQ, x.dtype = MLAF_F16;
    expect("split_qk_norm,w_q.dtype=f16", SPLIT(&p, &L, &x, &WK, &QO, &KN, &KP), MLAF_ERR_DTYPE, "w_q.dtype = f16, expected f32 or bf16");
    x = KP, x.dtype = MLAF_F32;
    expect("split_qk_norm,k_pe.dtype=f32", SPLIT(&p, &L, &WQ, &WK, &QO, &KN, &x), MLAF_ERR_DTYPE, "k_pe.dtype = f32, expected bf16");
    x = L, x.ndim = 3, x.shape[2] = 1, x.stride[1] = 1, x.stride[2] = 1;
    expect("split_qk_norm,latent.ndim=3", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_SHAPE, "latent.ndim = 3, expected 2");
    x = L, x.shape[1] = 1340;
    expect("split_qk_norm,latent.shape[1]=1340", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_SHAPE,
           "latent.shape[1] = 1340, expected q_lora_rank + kv_lora_rank + rope_dim = 1344");
    x = QO, x.shape[0] = T - 1;
    expect("split_qk_norm,q.shape[0]", SPLIT(&p, &L, &WQ, &WK, &x, &KN, &KP), MLAF_ERR_SHAPE, "q.shape[0] = 4, expected latent.shape[0] = 5");
    x = KP, x.shape[1] = R - 1;
    expect("split_qk_norm,k_pe.shape[1]", SPLIT(&p, &L, &WQ, &WK, &QO, &KN, &x), MLAF_ERR_SHAPE, "k_pe.shape[1] = 63, expected rope_dim = 64");
    x = WK, x.shape[0] = C - 1;
    expect("split_qk_norm,w_kv.shape[0]", SPLIT(&p, &L, &WQ, &x, &QO, &KN, &KP), MLAF_ERR_SHAPE, "w_kv.shape[0] = 511, expected kv_lora_rank = 512");
    x = L, x.shape[0] = -1;
    expect("split_qk_norm,latent.shape[0]=-1", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_SHAPE, "latent.shape[0] = -1, expected >= 0");
    x = L, x.stride[1] = 2;
    expect("split_qk_norm,latent.stride[1]=2", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_STRIDE, "latent.stride[1] = 2, expected 1");
    x = L, x.stride[0] = 1000;
    expect("split_qk_norm,latent.stride[0]<width", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_STRIDE, "latent.stride[0] = 1000, expected >= the row width 1344");
    x = KN, x.stride[0] = -C;
    expect("split_qk_norm,k_nope.stride[0]<0", SPLIT(&p, &L, &WQ, &WK, &QO, &x, &KP), MLAF_ERR_STRIDE, "k_nope.stride[0] = -512, expected >= 0");
    x = L, x.data = (char *)x.data + 1;
    expect("split_qk_norm,latent.data unaligned", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "latent.data = ");
    x = WK, x.data = (char *)x.data + 2;
    expect("split_qk_norm,w_kv.data unaligned", SPLIT(&p, &L, &WQ, &x, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "is not aligned to its element size (4 bytes)");
    x = L, x.data = NULL;
    expect("split_qk_norm,latent.data=NULL", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_NULL_POINTER, "latent.data is NULL");
    /* overlaps */
    x = mlaf_tensor_2d(P(B_Q), MLAF_BF16, T, C, C);
    expect("split_qk_norm,k_nope overlaps q", SPLIT(&p, &L, &WQ, &WK, &QO, &x, &KP), MLAF_ERR_OVERLAP, "q overlaps k_nope");
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, T, C, W); /* the q columns, not the kv ones */
    expect("split_qk_norm,k_nope in latent's q columns", SPLIT(&p, &L, &WQ, &WK, &QO, &x, &KP), MLAF_ERR_OVERLAP, "k_nope overlaps latent");
    x = mlaf_tensor_2d((char *)P(B_LAT) + Q * 2, MLAF_BF16, T, C, W + 8); /* right start, wrong stride */
    expect("split_qk_norm,in place with another stride", SPLIT(&p, &L, &WQ, &WK, &QO, &x, &KP), MLAF_ERR_OVERLAP, "k_nope overlaps latent");
    x = mlaf_tensor_2d((char *)P(B_LAT) + (Q + 2) * 2, MLAF_BF16, T, C, W); /* shifted columns */
    expect("split_qk_norm,k_nope shifted into k_pe columns", SPLIT(&p, &L, &WQ, &WK, &QO, &x, &KP), MLAF_ERR_OVERLAP, "overlaps latent");
    x = mlaf_tensor_2d(P(B_WKV), MLAF_BF16, 2, R, R);
    y = L, y.shape[0] = 2; /* two tokens so k_pe fits inside w_kv */
    {
        mlaf_tensor q2 = QO, k2 = KN;
        q2.shape[0] = k2.shape[0] = 2;
        expect("split_qk_norm,k_pe overlaps w_kv", SPLIT(&p, &y, &WQ, &WK, &q2, &k2, &x), MLAF_ERR_OVERLAP, "k_pe overlaps w_kv");
    }
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, T, Q, W); /* in-place q with the latent itself as k_pe */
    y = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, T, R, W);
    expect("split_qk_norm,k_pe = latent's q columns", SPLIT(&p, &L, &WQ, &WK, &x, &KN, &y), MLAF_ERR_OVERLAP, NULL);
    /* parameters */
    float bad_eps[4] = {0.0f, -1e-6f, NAN, INFINITY};
    const char *eps_names[4] = {"0", "-1e-06", "nan", "inf"};
    for (int k = 0; k < 4; k++) {
        char what[96], msg[64];
        pb = p, pb.eps_q = bad_eps[k];
        snprintf(what, sizeof what, "split_qk_norm,eps_q=%s", eps_names[k]);
        snprintf(msg, sizeof msg, "eps_q = %s, expected finite and > 0", eps_names[k]);
        expect(what, SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, msg);
        pb = p, pb.eps_kv = bad_eps[k];
        snprintf(what, sizeof what, "split_qk_norm,eps_kv=%s", eps_names[k]);
        snprintf(msg, sizeof msg, "eps_kv = %s, expected finite and > 0", eps_names[k]);
        expect(what, SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, msg);
    }
    pb = p, pb.q_lora_rank = -1;
    expect("split_qk_norm,q_lora_rank=-1", SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "q_lora_rank = -1, expected >= 0");
    pb = p, pb.kv_lora_rank = 0;
    expect("split_qk_norm,kv_lora_rank=0", SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "kv_lora_rank = 0, expected > 0");
    pb = p, pb.rope_dim = -2;
    expect("split_qk_norm,rope_dim=-2", SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "rope_dim = -2, expected >= 0");
    pb = p, pb.q_lora_rank = 1 << 20;
    expect("split_qk_norm,width>2^20", SPLIT(&pb, &L, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_LIMIT, "expected <= 1048576");
    pb = p, pb.q_lora_rank = 0;
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, T, C + R, W);
    expect("split_qk_norm,Q=0 with w_q", SPLIT(&pb, &x, &WQ, &WK, NULL, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "w_q is given but q_lora_rank = 0");
    expect("split_qk_norm,Q=0 with q", SPLIT(&pb, &x, NULL, &WK, &QO, &KN, &KP), MLAF_ERR_INVALID_ARGUMENT, "q is given but q_lora_rank = 0");
    /* T >= 2^31: rejected from the shape alone, before any byte is read */
    x = L, x.shape[0] = (int64_t)1 << 31;
    expect("split_qk_norm,T=2^31", SPLIT(&p, &x, &WQ, &WK, &QO, &KN, &KP), MLAF_ERR_LIMIT, "latent.shape[0] = 2147483648 tokens, expected < 2^31");
    /* T = 0 is a valid no-op that writes nothing */
    x = L, y = QO;
    mlaf_tensor k0 = KN, p0 = KP;
    x.shape[0] = y.shape[0] = k0.shape[0] = p0.shape[0] = 0;
    expect("split_qk_norm,T=0 no-op", SPLIT(&p, &x, &WQ, &WK, &y, &k0, &p0), MLAF_OK, "");
}

/* ---- mla_kv_cache ---------------------------------------------------------------------- */
#define KV(pp, lt, a, b, ps, c, s, ca, q, k, e, er) mlaf_mla_kv_cache(CTX, pp, lt, a, b, ps, c, s, ca, q, k, e, er)

static void kv_cases(void) {
    mlaf_mla_kv_cache_params p = {Q, C, R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED}, pb;
    mlaf_tensor L = lat(), WQ = wq(), WK = wkv(), QO = qo(), KN = kn(), KP = kp(), PS = pos(),
                CS = cs(), SL = slot(), CA = cache(), EC = ec(), x;
    expect("mla_kv_cache,ctx=NULL",
           mlaf_mla_kv_cache(NULL, &p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, NULL);
    expect("mla_kv_cache,params=NULL", KV(NULL, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "params is NULL");
    expect("mla_kv_cache,latent=NULL", KV(&p, NULL, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "latent is NULL");
    expect("mla_kv_cache,positions=NULL", KV(&p, &L, &WQ, &WK, NULL, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "positions is NULL");
    expect("mla_kv_cache,cos_sin=NULL", KV(&p, &L, &WQ, &WK, &PS, NULL, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "cos_sin is NULL");
    expect("mla_kv_cache,slot_mapping=NULL", KV(&p, &L, &WQ, &WK, &PS, &CS, NULL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "slot_mapping is NULL");
    expect("mla_kv_cache,kv_cache=NULL", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, NULL, &QO, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "kv_cache is NULL");
    expect("mla_kv_cache,q=NULL", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, NULL, &KN, &KP, &EC), MLAF_ERR_NULL_POINTER, "q is NULL");
    x = L, x.shape[1] = 1340;
    expect("mla_kv_cache,latent.shape[1]=1340", KV(&p, &x, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE,
           "latent.shape[1] = 1340, expected q_lora_rank + kv_lora_rank + rope_dim = 1344");
    x = PS, x.dtype = MLAF_F32;
    expect("mla_kv_cache,positions.dtype=f32", KV(&p, &L, &WQ, &WK, &x, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_DTYPE, "positions.dtype = f32, expected i32 or i64");
    x = PS, x.shape[0] = T + 1;
    expect("mla_kv_cache,positions.shape[0]", KV(&p, &L, &WQ, &WK, &x, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "positions.shape[0] = 6, expected tokens = 5");
    x = CS, x.dtype = MLAF_BF16;
    expect("mla_kv_cache,cos_sin.dtype=bf16", KV(&p, &L, &WQ, &WK, &PS, &x, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_DTYPE, "cos_sin.dtype = bf16, expected f32");
    x = CS, x.shape[1] = R / 2;
    expect("mla_kv_cache,cos_sin.shape[1]", KV(&p, &L, &WQ, &WK, &PS, &x, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "cos_sin.shape[1] = 32, expected rope_dim = 64");
    x = CS, x.shape[0] = 0;
    expect("mla_kv_cache,cos_sin.shape[0]=0", KV(&p, &L, &WQ, &WK, &PS, &x, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "cos_sin.shape[0] = 0, expected >= 1");
    x = SL, x.dtype = MLAF_I32, x.shape[0] = T + 1;
    expect("mla_kv_cache,slot_mapping.shape[0]", KV(&p, &L, &WQ, &WK, &PS, &CS, &x, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "slot_mapping.shape[0] = 6, expected <= latent.shape[0] = 5");
    x = SL, x.dtype = MLAF_BF16;
    expect("mla_kv_cache,slot_mapping.dtype=bf16", KV(&p, &L, &WQ, &WK, &PS, &CS, &x, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_DTYPE, "slot_mapping.dtype = bf16, expected i32 or i64");
    pb = p, pb.style = (mlaf_rope_style)5;
    expect("mla_kv_cache,style=5", KV(&pb, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_INVALID_ARGUMENT, "rope style = 5, expected 0 (interleaved), 1 (neox) or 2 (none)");
    pb = p, pb.rope_dim = R - 1;
    x = L, x.shape[1] = W - 1;
    {
        mlaf_tensor kp1 = KP, ca1 = CA, cs1 = CS;
        kp1.shape[1] = R - 1, ca1.shape[2] = C + R - 1, cs1.shape[1] = R - 1;
        expect("mla_kv_cache,rope_dim=63", KV(&pb, &x, &WQ, &WK, &PS, &cs1, &SL, &ca1, &QO, &KN, &kp1, &EC), MLAF_ERR_INVALID_ARGUMENT, "rope_dim = 63, expected even");
    }
    x = CA, x.ndim = 2;
    expect("mla_kv_cache,kv_cache.ndim=2", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "kv_cache.ndim = 2, expected 3");
    x = CA, x.shape[2] = C + R - 1;
    expect("mla_kv_cache,kv_cache.shape[2]", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "kv_cache.shape[2] = 575, expected kv_lora_rank + rope_dim = 576");
    x = CA, x.shape[1] = 0;
    expect("mla_kv_cache,block_size=0", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_SHAPE, "kv_cache.shape[1] = 0, expected >= 1 (block_size)");
    x = CA, x.dtype = MLAF_I32;
    expect("mla_kv_cache,kv_cache.dtype=i32", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_DTYPE, "kv_cache.dtype = i32, expected f32, f16 or bf16");
    x = CA, x.stride[1] = C + R - 1;
    expect("mla_kv_cache,kv_cache rows overlap", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_STRIDE, "kv_cache.stride[1] = 575, expected >= the row width 576");
    x = CA, x.stride[0] = (BS - 1) * (C + R);
    expect("mla_kv_cache,kv_cache blocks overlap", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_STRIDE, "overlap");
    x = EC, x.dtype = MLAF_I64;
    expect("mla_kv_cache,error_count.dtype=i64", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &x), MLAF_ERR_DTYPE, "error_count.dtype = i64, expected i32");
    x = EC, x.shape[0] = 2;
    expect("mla_kv_cache,error_count.shape[0]=2", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &x), MLAF_ERR_SHAPE, "error_count.shape[0] = 2, expected 1");
    x = mlaf_tensor_3d(P(B_LAT), MLAF_BF16, 1, 2, C + R, 2 * (C + R), C + R);
    expect("mla_kv_cache,kv_cache overlaps latent", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC), MLAF_ERR_OVERLAP, "kv_cache overlaps latent");
    x = mlaf_tensor_1d(P(B_POS), MLAF_I32, 1);
    expect("mla_kv_cache,error_count inside positions", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &x), MLAF_ERR_OVERLAP, "error_count overlaps positions");
    x = mlaf_tensor_2d(P(B_CACHE), MLAF_BF16, T, R, R);
    expect("mla_kv_cache,k_pe overlaps kv_cache", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &x, &EC), MLAF_ERR_OVERLAP, "k_pe overlaps kv_cache");
    x = mlaf_tensor_2d(P(B_CS), MLAF_BF16, T, C, C);
    expect("mla_kv_cache,k_nope overlaps cos_sin", KV(&p, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &x, &KP, &EC), MLAF_ERR_OVERLAP, "k_nope overlaps cos_sin");
    pb = p, pb.eps_kv = NAN;
    expect("mla_kv_cache,eps_kv=nan", KV(&pb, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_INVALID_ARGUMENT, "eps_kv = nan, expected finite and > 0");
    x = L, x.shape[0] = (int64_t)1 << 31;
    expect("mla_kv_cache,T=2^31", KV(&p, &x, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, &KN, &KP, &EC), MLAF_ERR_LIMIT, "latent.shape[0] = 2147483648 tokens, expected < 2^31");
}

/* ---- rope_q ---------------------------------------------------------------------------- */
static void rope_cases(void) {
    mlaf_rope_params p = {R, MLAF_ROPE_INTERLEAVED}, pb;
    mlaf_tensor Q3 = q3(), PS = pos(), CS = cs(), EC = ec(), x;
    expect("rope_q,ctx=NULL", mlaf_rope_q(NULL, &p, &Q3, &PS, &CS, &EC), MLAF_ERR_NULL_POINTER, NULL);
    expect("rope_q,params=NULL", mlaf_rope_q(CTX, NULL, &Q3, &PS, &CS, &EC), MLAF_ERR_NULL_POINTER, "params is NULL");
    expect("rope_q,q=NULL", mlaf_rope_q(CTX, &p, NULL, &PS, &CS, &EC), MLAF_ERR_NULL_POINTER, "q is NULL");
    expect("rope_q,positions=NULL", mlaf_rope_q(CTX, &p, &Q3, NULL, &CS, &EC), MLAF_ERR_NULL_POINTER, "positions is NULL");
    expect("rope_q,cos_sin=NULL", mlaf_rope_q(CTX, &p, &Q3, &PS, NULL, &EC), MLAF_ERR_NULL_POINTER, "cos_sin is NULL");
    pb = p, pb.rope_dim = 0;
    expect("rope_q,rope_dim=0", mlaf_rope_q(CTX, &pb, &Q3, &PS, &CS, &EC), MLAF_ERR_INVALID_ARGUMENT, "rope_dim = 0, expected > 0 and even");
    pb = p, pb.rope_dim = 63;
    x = CS, x.shape[1] = 63;
    expect("rope_q,rope_dim=63", mlaf_rope_q(CTX, &pb, &Q3, &PS, &x, &EC), MLAF_ERR_INVALID_ARGUMENT, "rope_dim = 63, expected even");
    pb = p, pb.style = (mlaf_rope_style)-1;
    expect("rope_q,style=-1", mlaf_rope_q(CTX, &pb, &Q3, &PS, &CS, &EC), MLAF_ERR_INVALID_ARGUMENT, "rope style = -1");
    x = mlaf_tensor_2d(P(B_Q3), MLAF_BF16, T, H * D, H * D);
    expect("rope_q,q.ndim=2", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_SHAPE, "q.ndim = 2, expected 3");
    x = Q3, x.shape[2] = 32, x.stride[1] = 32, x.stride[0] = H * 32;
    expect("rope_q,head dim < rope_dim", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_SHAPE, "q.shape[2] = 32, expected >= rope_dim = 64");
    x = Q3, x.dtype = MLAF_I32;
    expect("rope_q,q.dtype=i32", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_DTYPE, "q.dtype = i32, expected f32, f16 or bf16");
    x = Q3, x.stride[1] = D - 1;
    expect("rope_q,heads overlap", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_STRIDE, "q.stride[1] = 255, expected >= the row width 256");
    x = Q3, x.stride[0] = D;
    expect("rope_q,tokens overlap", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_STRIDE, "overlap");
    x = Q3, x.data = (char *)x.data + 1;
    expect("rope_q,q.data unaligned", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_INVALID_ARGUMENT, "q.data = ");
    x = CS, x.shape[1] = 32;
    expect("rope_q,cos_sin.shape[1]", mlaf_rope_q(CTX, &p, &Q3, &PS, &x, &EC), MLAF_ERR_SHAPE, "cos_sin.shape[1] = 32, expected rope_dim = 64");
    x = PS, x.shape[0] = 3;
    expect("rope_q,positions.shape[0]", mlaf_rope_q(CTX, &p, &Q3, &x, &CS, &EC), MLAF_ERR_SHAPE, "positions.shape[0] = 3, expected tokens = 5");
    x = mlaf_tensor_1d(P(B_Q3), MLAF_I32, 1);
    expect("rope_q,error_count inside q", mlaf_rope_q(CTX, &p, &Q3, &PS, &CS, &x), MLAF_ERR_OVERLAP, "q overlaps error_count");
    x = mlaf_tensor_3d(P(B_POS), MLAF_BF16, 1, 1, R, R, R);
    {
        mlaf_tensor p1 = mlaf_tensor_1d(P(B_POS), MLAF_I64, 1);
        expect("rope_q,q overlaps positions", mlaf_rope_q(CTX, &p, &x, &p1, &CS, &EC), MLAF_ERR_OVERLAP, "q overlaps positions");
    }
    x = Q3, x.shape[0] = (int64_t)1 << 31;
    expect("rope_q,T=2^31", mlaf_rope_q(CTX, &p, &x, &PS, &CS, &EC), MLAF_ERR_LIMIT, "q.shape[0] = 2147483648 tokens, expected < 2^31");
}

/* ---- sizes whose products do not fit in 64 bits ----------------------------------------- *
 * Each product of shapes and strides is checked before it is formed: these views are rejected
 * from their numbers (MLAF_ERR_LIMIT naming the tensor), never accepted because a product
 * wrapped to 0 or to a small span. */
static void overflow_cases(void) {
    const int64_t P40 = (int64_t)1 << 40, P52 = (int64_t)1 << 52, P58 = (int64_t)1 << 58,
                  P62 = (int64_t)1 << 62;
    mlaf_rope_params rp = {R, MLAF_ROPE_INTERLEAVED};
    mlaf_tensor PS = pos(), CS = cs(), EC = ec(), x;
    /* 2^58 heads of 64: 2^64 elements, a numel of 0 once wrapped, so a NULL q looked empty. */
    x = mlaf_tensor_3d(NULL, MLAF_BF16, 1, P58, R, R, R);
    mlaf_tensor p1 = mlaf_tensor_1d(P(B_POS), MLAF_I64, 1);
    expect("rope_q,q=[1,2^58,64] data=NULL", mlaf_rope_q(CTX, &rp, &x, &p1, &CS, &EC), MLAF_ERR_LIMIT,
           "q of shape (1, 288230376151711744, 64) spans 2^62 bytes or more");

    mlaf_mla_kv_cache_params kvp = {Q, C, R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED};
    mlaf_tensor L = lat(), WQ = wq(), WK = wkv(), QO = qo(), KN = kn(), KP = kp(), SL = slot();
    x = mlaf_tensor_3d(NULL, MLAF_BF16, P52, BS * 16, C + R, (int64_t)BS * 16 * (C + R), C + R);
    expect("mla_kv_cache,kv_cache=[2^52,64,576] data=NULL", KV(&kvp, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC),
           MLAF_ERR_LIMIT, "kv_cache of shape (4503599627370496, 64, 576) spans 2^62 bytes or more");
    x = mlaf_tensor_3d(P(B_CACHE), MLAF_BF16, P40, P40, C + R, P40 * (C + R), C + R);
    expect("mla_kv_cache,kv_cache=[2^40,2^40,576]", KV(&kvp, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC),
           MLAF_ERR_LIMIT, "kv_cache of shape (1099511627776, 1099511627776, 576) spans 2^62 bytes or more");
    /* (2^40 - 1) * 2^30 does not fit: the row check asks for a block stride no view can have. */
    x = mlaf_tensor_3d(P(B_CACHE), MLAF_BF16, 3, P40, C + R, (int64_t)1 << 31, (int64_t)1 << 30);
    expect("mla_kv_cache,kv_cache row check past 2^63", KV(&kvp, &L, &WQ, &WK, &PS, &CS, &SL, &x, &QO, &KN, &KP, &EC),
           MLAF_ERR_STRIDE, "kv_cache.stride = (2147483648, 1073741824, 1) makes rows of shape (3, 1099511627776, 576) overlap");

    /* Two rows 2^62 elements apart: the overlap spans wrapped and named the wrong reason. */
    enum { C2 = 32, R2 = 32 };
    mlaf_split_qk_norm_params sp = {0, C2, R2, 1e-5f, 1e-5f};
    mlaf_tensor wk2 = mlaf_tensor_1d(P(B_WKV), MLAF_F32, C2), kn2 = mlaf_tensor_2d(P(B_KN), MLAF_BF16, 2, C2, C2),
                kp2 = mlaf_tensor_2d(P(B_KP), MLAF_BF16, 2, R2, R2);
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, 2, C2 + R2, P62);
    expect("split_qk_norm,latent=[2,64] row stride 2^62", SPLIT(&sp, &x, NULL, &wk2, NULL, &kn2, &kp2), MLAF_ERR_LIMIT,
           "latent.stride[0] = 4611686018427387904 elements of 2 bytes, expected a step of < 2^62 bytes");
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, 2, C2 + R2, P62 / 2 - 1); /* a step just below 2^62 bytes ... */
    expect("split_qk_norm,latent spans 2^62 bytes", SPLIT(&sp, &x, NULL, &wk2, NULL, &kn2, &kp2), MLAF_ERR_LIMIT,
           "latent of shape (2, 64) spans 2^62 bytes or more"); /* ... but two rows reach past it */
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, 1, C2 + R2, P62);
    expect("split_qk_norm,latent stride 2^62 on one row", SPLIT(&sp, &x, NULL, &wk2, NULL, &kn2, &kp2), MLAF_ERR_LIMIT,
           "latent.stride[0] = 4611686018427387904");
    x = mlaf_tensor_2d(P(B_LAT), MLAF_BF16, 0, C2 + R2, P62 / 2 - 1); /* empty: no extent to span */
    {
        mlaf_tensor k0 = kn2, p0 = kp2;
        k0.shape[0] = p0.shape[0] = 0;
        expect("split_qk_norm,T=0 with a step just below 2^62 bytes", SPLIT(&sp, &x, NULL, &wk2, NULL, &k0, &p0), MLAF_OK, "");
    }
    /* A view whose last byte lies past the top of the address space. */
    x = mlaf_tensor_2d((void *)(UINTPTR_MAX - 63), MLAF_BF16, 2, C2 + R2, C2 + R2);
    expect("split_qk_norm,latent past the address space", SPLIT(&sp, &x, NULL, &wk2, NULL, &kn2, &kp2), MLAF_ERR_LIMIT,
           "run past the end of the address space");
}

/* The error counter saturates at INT32_MAX: a counter at the top plus one bad token stays at the
 * top (no signed overflow in the library, no wrap to negative). Run last: the library side is
 * in the backends' counting. */
static void error_count_cases(void) {
    char name[160];
    const int32_t top = INT32_MAX;
    int64_t bad_pos[T] = {0, 1, MAXP + 3, 2, 3}; /* token 2: a position outside the table */
    mlaf_gbuf ecb, posb;
    memset(&ecb, 0, sizeof ecb);
    memset(&posb, 0, sizeof posb);
    if (mlaf_gbuf_alloc(&ecb, BE, 4, &top, 0) != MLAF_OK || mlaf_gbuf_alloc(&posb, BE, sizeof bad_pos, bad_pos, 0) != MLAF_OK) {
        tl_case(0, "API(error_count,setup)", "buffer allocation failed");
        mlaf_gbuf_free(&ecb);
        mlaf_gbuf_free(&posb);
        return;
    }
    mlaf_rope_params rp = {R, MLAF_ROPE_INTERLEAVED};
    mlaf_tensor Q3 = q3(), PS = mlaf_tensor_1d(posb.ptr, MLAF_I64, T), CS = cs(), EC = mlaf_tensor_1d(ecb.ptr, MLAF_I32, 1);
    mlaf_status st = mlaf_rope_q(CTX, &rp, &Q3, &PS, &CS, &EC);
    int32_t got = 0;
    if (mlaf_context_sync(CTX) == MLAF_OK && mlaf_gbuf_download(&ecb) == MLAF_OK) memcpy(&got, ecb.body, 4);
    snprintf(name, sizeof name, "API(rope_q,error_count=INT32_MAX + 1 bad token,backend=%s)", mlaf_backend_name(BE));
    tl_case(st == MLAF_OK && got == INT32_MAX, name, "status %s, error_count %d (expected %d)", mlaf_status_name(st), (int)got,
            (int)INT32_MAX);

    mlaf_mla_kv_cache_params kvp = {Q, C, R, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED};
    mlaf_tensor L = lat(), WQ = wq(), WK = wkv(), QO = qo(), SL = slot(), CA = cache();
    memcpy(ecb.body, &top, 4);
    mlaf_gbuf_upload(&ecb);
    st = KV(&kvp, &L, &WQ, &WK, &PS, &CS, &SL, &CA, &QO, NULL, NULL, &EC);
    got = 0;
    if (mlaf_context_sync(CTX) == MLAF_OK && mlaf_gbuf_download(&ecb) == MLAF_OK) memcpy(&got, ecb.body, 4);
    snprintf(name, sizeof name, "API(mla_kv_cache,error_count=INT32_MAX + 1 bad token,backend=%s)", mlaf_backend_name(BE));
    tl_case(st == MLAF_OK && got == INT32_MAX, name, "status %s, error_count %d (expected %d)", mlaf_status_name(st), (int)got,
            (int)INT32_MAX);
    mlaf_gbuf_free(&ecb);
    mlaf_gbuf_free(&posb);
}

/* ---- YaRN tables ------------------------------------------------------------------------ *
 * The reference is a plain float64 transcription of the Hugging Face YaRN initialisation
 * (_compute_yarn_parameters: correction range, linear ramp, interpolation / extrapolation
 * blend, attention factor from get_mscale) followed by cos / sin of position x inv_freq times
 * the attention factor, in its own order of operations. */
typedef struct hf_rope_scaling {
    double factor, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor; /* 0: key absent */
    double original_max_position_embeddings;
    int truncate;
} hf_rope_scaling;

static double hf_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

static double hf_attention_factor(const hf_rope_scaling *c) {
    if (c->attention_factor != 0) return c->attention_factor;
    if (c->mscale != 0 && c->mscale_all_dim != 0)
        return hf_get_mscale(c->factor, c->mscale) / hf_get_mscale(c->factor, c->mscale_all_dim);
    return hf_get_mscale(c->factor, 1.0);
}

#define PI_ 3.14159265358979323846
static double hf_find_correction_dim(double num_rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (num_rotations * 2 * PI_))) / (2 * log(base));
}

/* inv_freq[dim / 2] */
static void hf_yarn_inv_freq(const hf_rope_scaling *c, int dim, double base, double *inv_freq) {
    double beta_fast = c->beta_fast != 0 ? c->beta_fast : 32, beta_slow = c->beta_slow != 0 ? c->beta_slow : 1;
    double low = hf_find_correction_dim(beta_fast, dim, base, c->original_max_position_embeddings);
    double high = hf_find_correction_dim(beta_slow, dim, base, c->original_max_position_embeddings);
    if (c->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = fmax(low, 0);
    high = fmin(high, dim - 1);
    if (low == high) high += 0.001;
    for (int k = 0; k < dim / 2; k++) {
        double pos_freq = pow(base, (double)(2 * k) / dim);
        double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (c->factor * pos_freq);
        double ramp = fmin(fmax((k - low) / (high - low), 0), 1);
        double extrapolation_factor = 1 - ramp;
        inv_freq[k] = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
}

/* Worst |got - ref| in units of max(2^-24 |ref|, 2^-30) over the rows 0, step, 2 step, ... and the last. */
static double yarn_table_units(const float *tab, int64_t max_pos, int dim, double base, const hf_rope_scaling *c,
                               int64_t step, int64_t *worst_at) {
    double inv_freq[256], att = hf_attention_factor(c), worst = 0;
    hf_yarn_inv_freq(c, dim, base, inv_freq);
    for (int64_t r = 0; r <= (max_pos - 1) / step + 1; r++) {
        int64_t p = r * step < max_pos ? r * step : max_pos - 1;
        for (int k = 0; k < dim / 2; k++) {
            double ang = (double)p * inv_freq[k], ref[2] = {cos(ang) * att, sin(ang) * att};
            double got[2] = {tab[p * dim + k], tab[p * dim + dim / 2 + k]};
            for (int j = 0; j < 2; j++) {
                double u = fabs(got[j] - ref[j]) / fmax(ldexp(fabs(ref[j]), -24), ldexp(1.0, -30));
                if (u > worst) worst = u, *worst_at = p;
            }
        }
    }
    return worst;
}

static void yarn_cases(void) {
    char name[200];
    /* DeepSeek-V3: rope_theta 10000, qk_rope_head_dim 64, rope_scaling {type yarn, factor 40,
     * original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1}. */
    enum { DIM = 64 };
    const int64_t MAXP_V3 = 4096 * 40;
    const double base = 10000.0;
    float *tab = malloc(sizeof(float) * (size_t)MAXP_V3 * DIM);
    if (!tab) {
        tl_case(0, "ROPE_TABLE(yarn,setup)", "out of memory");
        return;
    }
    mlaf_rope_scaling y = mlaf_rope_scaling_yarn(40, 4096);
    y.mscale = 1, y.mscale_all_dim = 1;
    hf_rope_scaling hf = {40, 32, 1, 1, 1, 0, 4096, 1};
    int64_t at = 0;
    mlaf_status st = mlaf_rope_table_init_scaled(tab, MAXP_V3, DIM, base, &y);
    double u = st == MLAF_OK ? yarn_table_units(tab, MAXP_V3, DIM, base, &hf, 61, &at) : INFINITY;
    tl_case(st == MLAF_OK && u <= 2.0, "ROPE_TABLE(yarn,preset=deepseek-v3,max_pos=163840,dim=64)",
            "status %s, worst %.3g units (of 2^-24 relative) at position %lld", mlaf_status_name(st), u, (long long)at);
    /* The correction band for these numbers is [10, 23]: index 0 keeps base^0 = 1, index 31 is
     * divided by the factor, and mscale = mscale_all_dim makes the attention factor exactly 1. */
    int band = st == MLAF_OK && tab[1 * DIM + 0] == (float)cos(1.0) && tab[1 * DIM + DIM / 2 + 0] == (float)sin(1.0) &&
               tab[100 * DIM + 31] == (float)cos(100.0 * pow(base, -62.0 / 64) / 40) &&
               mlaf_rope_scaling_attention_factor(&y) == 1.0;
    tl_case(band, "ROPE_TABLE(yarn,deepseek-v3 band [10, 23] and attention factor 1)", "values differ");

    /* The attention-factor rules, each against the transcription (a small table suffices). */
    static const struct {
        const char *what;
        double factor, orig, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
        int truncate;
        double base;
        int dim;
    } var[5] = {
        {"hf defaults,factor=4,orig=32768 (no mscales: m(4, 1))", 4, 32768, 0, 0, 0, 0, 0, 1, 1000000.0, 128},
        {"deepseek-v2 (mscale 0.707 / 0.707)", 40, 4096, 32, 1, 0.707, 0.707, 0, 1, 10000.0, 64},
        {"kimi-k2 (factor 32, beta 1 / 1)", 32, 4096, 1, 1, 1, 1, 0, 1, 50000.0, 64},
        {"mscale 1 without mscale_all_dim", 40, 4096, 32, 1, 1, 0, 0, 1, 10000.0, 64},
        {"deepseek-v4 compressed (factor 16, attention_factor 1, truncate off)", 16, 65536, 32, 1, 0, 0, 1, 0, 160000.0, 64},
    };
    for (int k = 0; k < 5; k++) {
        const int64_t mp = 9000;
        mlaf_rope_scaling sc = mlaf_rope_scaling_yarn(var[k].factor, (int64_t)var[k].orig);
        if (var[k].beta_fast != 0) sc.beta_fast = var[k].beta_fast;
        if (var[k].beta_slow != 0) sc.beta_slow = var[k].beta_slow;
        sc.mscale = var[k].mscale, sc.mscale_all_dim = var[k].mscale_all_dim, sc.attention_factor = var[k].attention_factor;
        sc.truncate = var[k].truncate;
        hf_rope_scaling h = {var[k].factor, var[k].beta_fast, var[k].beta_slow, var[k].mscale, var[k].mscale_all_dim,
                             var[k].attention_factor, var[k].orig, var[k].truncate};
        st = mlaf_rope_table_init_scaled(tab, mp, var[k].dim, var[k].base, &sc);
        u = st == MLAF_OK ? yarn_table_units(tab, mp, var[k].dim, var[k].base, &h, 7, &at) : INFINITY;
        double a = mlaf_rope_scaling_attention_factor(&sc), ha = hf_attention_factor(&h);
        snprintf(name, sizeof name, "ROPE_TABLE(yarn,%s)", var[k].what);
        tl_case(st == MLAF_OK && u <= 2.0 && fabs(a - ha) <= 1e-15 * ha, name,
                "status %s, worst %.3g units at position %lld, attention factor %.17g (reference %.17g)",
                mlaf_status_name(st), u, (long long)at, a, ha);
    }

    /* No scaling is the plain table, bit for bit; bad parameters leave the table untouched. */
    float *plain = malloc(sizeof(float) * 64 * DIM);
    int same = plain && mlaf_rope_table_init(plain, 64, DIM, base) == MLAF_OK;
    mlaf_rope_scaling none;
    memset(&none, 0, sizeof none);
    same = same && mlaf_rope_table_init_scaled(tab, 64, DIM, base, NULL) == MLAF_OK && !memcmp(tab, plain, sizeof(float) * 64 * DIM);
    same = same && mlaf_rope_table_init_scaled(tab, 64, DIM, base, &none) == MLAF_OK && !memcmp(tab, plain, sizeof(float) * 64 * DIM);
    tl_case(same, "ROPE_TABLE(scaling=NULL and NONE equal the plain table)", "tables differ");
    int rejected = 1;
    for (int k = 0; k < 10; k++) {
        mlaf_rope_scaling b = mlaf_rope_scaling_yarn(40, 4096);
        switch (k) {
        case 0: b.factor = 0.5; break;
        case 1: b.factor = NAN; break;
        case 2: b.original_max_position_embeddings = 0; break;
        case 3: b.beta_fast = 0; break;
        case 4: b.beta_slow = -1; break;
        case 5: b.mscale = -0.5; break;
        case 6: b.mscale_all_dim = INFINITY; break;
        case 7: b.attention_factor = -1; break;
        case 8: b.type = (mlaf_rope_scaling_type)7; break;
        default: b.factor = INFINITY; break;
        }
        memcpy(tab, plain, sizeof(float) * 64 * DIM);
        rejected = rejected && mlaf_rope_table_init_scaled(tab, 64, DIM, base, &b) == MLAF_ERR_INVALID_ARGUMENT &&
                   !memcmp(tab, plain, sizeof(float) * 64 * DIM) && isnan(mlaf_rope_scaling_attention_factor(&b));
    }
    mlaf_rope_scaling ok = mlaf_rope_scaling_yarn(40, 4096);
    rejected = rejected && mlaf_rope_table_init_scaled(NULL, 64, DIM, base, &ok) == MLAF_ERR_NULL_POINTER &&
               mlaf_rope_table_init_scaled(tab, 64, 63, base, &ok) == MLAF_ERR_INVALID_ARGUMENT &&
               mlaf_rope_table_init_scaled(tab, 0, DIM, base, &ok) == MLAF_ERR_INVALID_ARGUMENT &&
               mlaf_rope_table_init_scaled(tab, 64, DIM, 1.0, &ok) == MLAF_ERR_INVALID_ARGUMENT &&
               mlaf_rope_scaling_attention_factor(NULL) == 1.0;
    tl_case(rejected, "ROPE_TABLE(yarn,bad parameters rejected, table untouched)", "a bad scaling was accepted");
    free(plain);
    free(tab);
}

/* ---- context, presets, tables, names, version ------------------------------------------ */
static void context_cases(void) {
    char name[160];
#define CASE(cond, what) \
    (snprintf(name, sizeof name, "API(%s,backend=%s)", what, mlaf_backend_name(BE)), TL_CHECK(cond, name))
    mlaf_context *c = (mlaf_context *)0x1;
    CASE(mlaf_context_create(NULL, BE) == MLAF_ERR_NULL_POINTER, "context_create,out=NULL");
    CASE(mlaf_context_create(&c, (mlaf_backend)7) == MLAF_ERR_INVALID_ARGUMENT && c == NULL, "context_create,backend=7");
    if (!mlaf_backend_available(MLAF_BACKEND_CUDA)) {
        c = (mlaf_context *)0x1;
        CASE(mlaf_context_create(&c, MLAF_BACKEND_CUDA) == MLAF_ERR_BACKEND_UNAVAILABLE && c == NULL, "context_create,cuda unavailable");
    }
    mlaf_context_free(NULL);
    CASE(1, "context_free(NULL)");
    CASE(mlaf_context_set_threads(NULL, 1) == MLAF_ERR_NULL_POINTER, "set_threads,ctx=NULL");
    int before = mlaf_context_threads(CTX);
    CASE(mlaf_context_set_threads(CTX, -1) == MLAF_ERR_INVALID_ARGUMENT &&
             strstr(mlaf_context_last_error(CTX), "threads = -1, expected >= 0") && mlaf_context_threads(CTX) == before,
         "set_threads,-1");
    CASE(mlaf_context_set_threads(CTX, 3) == MLAF_OK && mlaf_context_threads(CTX) == 3 &&
             mlaf_context_last_error(CTX)[0] == '\0', "set_threads,3");
    CASE(mlaf_context_set_threads(CTX, 0) == MLAF_OK && mlaf_context_threads(CTX) >= 1, "set_threads,0=all cores");
    CASE(mlaf_context_threads(NULL) == 0, "context_threads(NULL)");
    /* Above the bound an OpenMP runtime may end the process when it cannot make the team. */
    CASE(mlaf_context_set_threads(CTX, MLAF_MAX_THREADS) == MLAF_OK && mlaf_context_threads(CTX) == MLAF_MAX_THREADS,
         "set_threads,MLAF_MAX_THREADS");
    CASE(mlaf_context_set_threads(CTX, 100000) == MLAF_ERR_LIMIT &&
             strstr(mlaf_context_last_error(CTX), "threads = 100000, expected <= 1024") &&
             mlaf_context_threads(CTX) == MLAF_MAX_THREADS,
         "set_threads,100000 rejected");
    CASE(mlaf_context_set_threads(CTX, MLAF_MAX_THREADS + 1) == MLAF_ERR_LIMIT, "set_threads,MLAF_MAX_THREADS+1 rejected");
    CASE(mlaf_context_set_threads(CTX, 0) == MLAF_OK && mlaf_context_threads(CTX) >= 1 &&
             mlaf_context_threads(CTX) <= MLAF_MAX_THREADS, "set_threads,0 within the bound");
    CASE(mlaf_context_set_cpu_isa(NULL, MLAF_CPU_ISA_AUTO) == MLAF_ERR_NULL_POINTER, "set_cpu_isa,ctx=NULL");
    mlaf_cpu_isa isa0 = mlaf_context_cpu_isa(CTX);
    CASE(mlaf_context_set_cpu_isa(CTX, (mlaf_cpu_isa)9) == MLAF_ERR_INVALID_ARGUMENT &&
             strstr(mlaf_context_last_error(CTX), "cpu isa = 9, expected 0..3") && mlaf_context_cpu_isa(CTX) == isa0,
         "set_cpu_isa,9");
    for (int i = MLAF_CPU_ISA_SCALAR; i < MLAF_CPU_ISA_COUNT_; i++) {
        mlaf_status st = mlaf_context_set_cpu_isa(CTX, (mlaf_cpu_isa)i);
        char what[64];
        snprintf(what, sizeof what, "set_cpu_isa,%s", mlaf_cpu_isa_name((mlaf_cpu_isa)i));
        CASE(st == MLAF_OK ? mlaf_context_cpu_isa(CTX) == (mlaf_cpu_isa)i
                           : st == MLAF_ERR_UNSUPPORTED && strstr(mlaf_context_last_error(CTX), "not supported"),
             what);
    }
    CASE(mlaf_context_set_cpu_isa(CTX, MLAF_CPU_ISA_AUTO) == MLAF_OK && mlaf_context_cpu_isa(CTX) != MLAF_CPU_ISA_AUTO,
         "set_cpu_isa,auto resolves");
    CASE(mlaf_context_cpu_isa(NULL) == MLAF_CPU_ISA_SCALAR && !strcmp(mlaf_cpu_isa_name((mlaf_cpu_isa)99), "unknown"),
         "cpu_isa(NULL),isa_name(99)");
    if (BE == MLAF_BACKEND_CPU) {
        CASE(mlaf_context_set_cuda_device(CTX, 0) != MLAF_OK && strstr(mlaf_context_last_error(CTX), "set_cuda_device on a cpu context"),
             "set_cuda_device on cpu");
        CASE(mlaf_context_set_cuda_stream(CTX, NULL) == MLAF_ERR_INVALID_ARGUMENT &&
                 strstr(mlaf_context_last_error(CTX), "set_cuda_stream on a cpu context"), "set_cuda_stream on cpu");
    } else {
        CASE(mlaf_context_set_cuda_device(CTX, -1) == MLAF_ERR_INVALID_ARGUMENT && strstr(mlaf_context_last_error(CTX), "cuda device = -1"),
             "set_cuda_device,-1");
        CASE(mlaf_context_set_cuda_device(CTX, 0) == MLAF_OK, "set_cuda_device,0");
    }
    CASE(mlaf_context_set_cuda_device(NULL, 0) == MLAF_ERR_NULL_POINTER && mlaf_context_set_cuda_stream(NULL, NULL) == MLAF_ERR_NULL_POINTER,
         "set_cuda_*,ctx=NULL");
    CASE(!strcmp(mlaf_context_last_error(NULL), "context is NULL") && mlaf_context_backend(NULL) == MLAF_BACKEND_CPU &&
             mlaf_context_backend(CTX) == BE, "last_error(NULL),backend()");

    /* presets */
    static const struct { const char *name; int Q, C, R, E, k; } want[5] = {
        {"glm-4.7-flash", 768, 512, 64, 64, 4}, {"deepseek-v3", 1536, 512, 64, 256, 8},
        {"deepseek-v2", 1536, 512, 64, 160, 6}, {"deepseek-v2-lite", 0, 512, 64, 64, 6},
        {"kimi-k2", 1536, 512, 64, 384, 8}};
    int presets_ok = mlaf_preset_count() == 11 && !strcmp(mlaf_preset_at(0)->name, "glm-4.7-flash");
    for (int i = 0; i < 5; i++) {
        const mlaf_model_config *m = mlaf_preset_find(want[i].name);
        presets_ok = presets_ok && m && m->q_lora_rank == want[i].Q && m->kv_lora_rank == want[i].C &&
                     m->qk_rope_head_dim == want[i].R && m->n_routed_experts == want[i].E && m->top_k == want[i].k &&
                     m->rope_style == MLAF_ROPE_INTERLEAVED && m->index_n_heads == 0 && m->kv_rope_tail == 0 &&
                     m->n_hash_layers == 0;
    }
    CASE(presets_ok, "presets match the preset tables (docs/models.md)");
    /* the DSA presets: MLA RoPE interleaved in both; the indexer's interleaved for GLM-5 and NeoX
     * for DeepSeek-V3.2 (getting it wrong was a real accuracy bug in three engines) */
    const mlaf_model_config *g5 = mlaf_preset_find("glm-5"), *v32 = mlaf_preset_find("deepseek-v3.2");
    CASE(g5 && g5->q_lora_rank == 2048 && g5->kv_lora_rank == 512 && g5->qk_rope_head_dim == 64 && g5->num_heads == 64 &&
             g5->n_routed_experts == 256 && g5->top_k == 8 && g5->n_group == 1 && g5->routed_scaling_factor == 2.5f &&
             g5->rms_norm_eps == 1e-5f && g5->rope_style == MLAF_ROPE_INTERLEAVED && g5->index_n_heads == 32 &&
             g5->index_head_dim == 128 && g5->index_topk == 2048 && g5->index_rope_style == MLAF_ROPE_INTERLEAVED,
         "preset glm-5 (indexer 32 x 128, interleaved)");
    CASE(v32 && v32->q_lora_rank == 1536 && v32->n_group == 8 && v32->topk_group == 4 && v32->rms_norm_eps == 1e-6f &&
             v32->rope_style == MLAF_ROPE_INTERLEAVED && v32->index_n_heads == 64 && v32->index_head_dim == 128 &&
             v32->index_topk == 2048 && v32->index_rope_style == MLAF_ROPE_NEOX,
         "preset deepseek-v3.2 (indexer 64 x 128, NeoX)");
    /* DeepSeek-V4-Flash: [1024 | 512] latent with RoPE on the last 64 kv values, sqrt(softplus)
     * router, the first 3 layers hash-routed (docs/models.md) */
    const mlaf_model_config *v4 = mlaf_preset_find("deepseek-v4-flash");
    mlaf_moe_gate_params v4p = mlaf_moe_gate_params_from_config(v4);
    CASE(v4 && v4->q_lora_rank == 1024 && v4->kv_lora_rank == 512 && v4->qk_rope_head_dim == 0 &&
             v4->kv_rope_tail == 64 && v4->qk_nope_head_dim == 448 && v4->v_head_dim == 512 && v4->num_heads == 64 &&
             v4->n_routed_experts == 256 && v4->top_k == 6 && v4->n_group == 1 && v4->topk_group == 1 &&
             v4->score_func == MLAF_SCORE_SQRT_SOFTPLUS && v4->has_score_bias && v4->norm_topk_prob &&
             v4->routed_scaling_factor == 1.5f && v4->apply_routed_scaling && v4->rms_norm_eps == 1e-6f &&
             v4->n_shared_experts == 1 && v4->n_hash_layers == 3 && v4->index_n_heads == 0 &&
             v4p.score_func == MLAF_SCORE_SQRT_SOFTPLUS && v4p.top_k == 6 && v4p.renormalize && v4p.eps == 1e-20f &&
             v4p.routed_scaling_factor == 1.5f,
         "preset deepseek-v4-flash (kv_rope_tail 64, sqrt_softplus, 3 hash layers)");
    /* the 2026 models (docs/models.md): GLM-5.3-Flash NoPE (R 0, no DSA indexer), Kimi-K3 (896 experts,
     * top-16, two shared), DeepSeek-V4.1-Flash (V4's layout, q_lora 1280, eps 1e-20, no hash layers) */
    const mlaf_model_config *g53 = mlaf_preset_find("glm-5.3-flash"), *k3 = mlaf_preset_find("kimi-k3"),
                            *v41 = mlaf_preset_find("deepseek-v4.1-flash");
    CASE(g53 && g53->q_lora_rank == 1536 && g53->kv_lora_rank == 512 && g53->qk_rope_head_dim == 0 &&
             g53->qk_nope_head_dim == 256 && g53->v_head_dim == 256 && g53->num_heads == 64 &&
             g53->n_routed_experts == 288 && g53->top_k == 8 && g53->n_group == 1 && g53->has_score_bias &&
             g53->routed_scaling_factor == 2.5f && g53->rms_norm_eps == 1e-5f && g53->n_shared_experts == 1 &&
             g53->index_n_heads == 0 && g53->kv_rope_tail == 0 && g53->n_hash_layers == 0,
         "preset glm-5.3-flash (NoPE, 288 experts top-8)");
    CASE(k3 && k3->q_lora_rank == 1536 && k3->kv_lora_rank == 512 && k3->qk_rope_head_dim == 64 &&
             k3->qk_nope_head_dim == 128 && k3->v_head_dim == 128 && k3->num_heads == 96 && k3->n_routed_experts == 896 &&
             k3->top_k == 16 && k3->n_group == 1 && k3->score_func == MLAF_SCORE_SIGMOID && k3->has_score_bias &&
             k3->norm_topk_prob && k3->routed_scaling_factor == 1.0f && k3->rms_norm_eps == 1e-5f &&
             k3->n_shared_experts == 2 && k3->index_n_heads == 0 && k3->kv_rope_tail == 0 &&
             k3->rope_style == MLAF_ROPE_NONE,
         "preset kimi-k3 (896 experts top-16, two shared, rope slot not rotated)");
    CASE(!strcmp(mlaf_rope_style_name(MLAF_ROPE_NONE), "none") && !strcmp(mlaf_rope_style_name(MLAF_ROPE_NEOX), "neox") &&
             !strcmp(mlaf_rope_style_name((mlaf_rope_style)7), "unknown"),
         "mlaf_rope_style_name");
    CASE(v41 && v41->q_lora_rank == 1280 && v41->kv_lora_rank == 512 && v41->qk_rope_head_dim == 0 &&
             v41->kv_rope_tail == 64 && v41->qk_nope_head_dim == 448 && v41->num_heads == 64 &&
             v41->n_routed_experts == 384 && v41->top_k == 6 && v41->score_func == MLAF_SCORE_SQRT_SOFTPLUS &&
             v41->routed_scaling_factor == 1.5f && v41->rms_norm_eps == 1e-20f && v41->n_shared_experts == 1 &&
             v41->n_hash_layers == 0 && v41->index_n_heads == 0,
         "preset deepseek-v4.1-flash (q_lora 1280, 384 experts top-6, no hash layers)");
    CASE(mlaf_preset_find(NULL) == NULL && mlaf_preset_find("no-such-model") == NULL && mlaf_preset_find("") == NULL &&
             mlaf_preset_find("glm-4.7") == NULL, "preset_find,unknown");
    CASE(mlaf_preset_find("GLM-4.7-Flash") == mlaf_preset_at(0) && mlaf_preset_find("DeepSeek-R1") == mlaf_preset_find("deepseek-v3"),
         "preset_find,case-insensitive and r1 alias");
    CASE(mlaf_preset_at(-1) == NULL && mlaf_preset_at(mlaf_preset_count()) == NULL, "preset_at,out of range");

    /* rope_table_init */
    float tab[8 * 4], canary[8 * 4];
    for (int i = 0; i < 32; i++) tab[i] = canary[i] = -7.0f;
    int untouched = 1;
    mlaf_status st[8] = {
        mlaf_rope_table_init(NULL, 8, 4, 10000.0), mlaf_rope_table_init(tab, 0, 4, 10000.0),
        mlaf_rope_table_init(tab, 8, 0, 10000.0),  mlaf_rope_table_init(tab, 8, 3, 10000.0),
        mlaf_rope_table_init(tab, 8, -4, 10000.0), mlaf_rope_table_init(tab, 8, 4, 1.0),
        mlaf_rope_table_init(tab, 8, 4, NAN),      mlaf_rope_table_init(tab, 8, 4, INFINITY)};
    untouched = !memcmp(tab, canary, sizeof tab);
    CASE(st[0] == MLAF_ERR_NULL_POINTER && st[1] == MLAF_ERR_INVALID_ARGUMENT && st[2] == MLAF_ERR_INVALID_ARGUMENT &&
             st[3] == MLAF_ERR_INVALID_ARGUMENT && st[4] == MLAF_ERR_INVALID_ARGUMENT && st[5] == MLAF_ERR_INVALID_ARGUMENT &&
             st[6] == MLAF_ERR_INVALID_ARGUMENT && st[7] == MLAF_ERR_INVALID_ARGUMENT && untouched,
         "rope_table_init,misuse rejected and table untouched");
    int vals = mlaf_rope_table_init(tab, 8, 4, 10000.0) == MLAF_OK && tab[0] == 1.0f && tab[1] == 1.0f && tab[2] == 0.0f &&
               tab[3] == 0.0f && tab[7 * 4 + 0] == (float)cos(7.0) && tab[7 * 4 + 3] == (float)sin(7.0 * pow(10000.0, -0.5));
    CASE(vals, "rope_table_init,values");

    /* names and version */
    int names_ok = 1;
#define CHECK_STATUS_(nm, value, msg) \
    names_ok = names_ok && !strcmp(mlaf_status_name(nm), #nm) && !strcmp(mlaf_status_message(nm), msg) && (int)(nm) == value;
    MLAF_STATUS_TABLE(CHECK_STATUS_)
#undef CHECK_STATUS_
    CASE(names_ok, "status names and messages, every code");
    CASE(!strcmp(mlaf_status_name((mlaf_status)999), "MLAF_UNKNOWN_STATUS") && !strcmp(mlaf_status_message((mlaf_status)-3), "unknown status"),
         "status name,unknown code");
    CASE(mlaf_dtype_size(MLAF_BF16) == 2 && mlaf_dtype_size(MLAF_I64) == 8 && mlaf_dtype_size((mlaf_dtype)42) == 0 &&
             !strcmp(mlaf_dtype_name(MLAF_F16), "f16") && !strcmp(mlaf_dtype_name((mlaf_dtype)42), "unknown") &&
             !strcmp(mlaf_backend_name(MLAF_BACKEND_CUDA), "cuda") && !strcmp(mlaf_op_name(MLAF_OP_ROPE_Q), "rope_q") &&
             !strcmp(mlaf_op_name((mlaf_op)9), "unknown"), "dtype / backend / op names");
    CASE(mlaf_backend_supports(MLAF_BACKEND_CPU, MLAF_OP_SPLIT_QK_NORM) && mlaf_backend_supports(MLAF_BACKEND_CPU, MLAF_OP_MLA_KV_CACHE) &&
             mlaf_backend_supports(MLAF_BACKEND_CPU, MLAF_OP_ROPE_Q) && !mlaf_backend_supports(MLAF_BACKEND_CPU, (mlaf_op)9) &&
             mlaf_backend_available(MLAF_BACKEND_CPU) && !mlaf_backend_available((mlaf_backend)5), "backend_supports / available");
    CASE(mlaf_version_number() == MLAF_VERSION_NUMBER && !strcmp(mlaf_version_string(), MLAF_VERSION_STRING), "VERSION(header==library)");
#undef CASE
}

int main(void) {
    mlaf_backend bes[MLAF_BACKEND_COUNT_];
    int nb = tl_backends(bes);
    for (int bi = 0; bi < nb; bi++) {
        BE = bes[bi];
        CTX = tl_context(BE);
        if (!CTX) continue;
        setup();
        if (SETUP_OK) {
            split_cases();
            kv_cases();
            rope_cases();
            overflow_cases();
        } else {
            tl_case(0, "API(setup)", "buffer allocation failed");
        }
        context_cases();
        if (BE == MLAF_BACKEND_CPU) yarn_cases(); /* host tables: once */
        if (SETUP_OK) error_count_cases();
        teardown();
        mlaf_context_free(CTX);
    }
    return tl_finish();
}
