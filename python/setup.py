"""Builds libmlafuse with CMake from the repository root and bundles it in mlafuse/lib/.

1. CMake configures the repository (the parent of this folder) into python/build/cmake with
   tests, tools and kernel experiments off; CUDA as MLAFUSE_CUDA says (default: on when
   nvcc is found).
2. Only the shared-library target is built.
3. The real library file is copied, as mlafuse/lib/libmlafuse.so, into the source package
   (git-ignored; so a source checkout finds it too) and into the wheel's build directory.
   One file, not the soname symlink chain: wheels would store each link as a full copy.

4. When torch can be imported at build time (pip install --no-build-isolation, torch in that
   environment), the compiled torch binding csrc/mlafuse_torch*.cpp is built with torch's own
   extension tooling (torch.utils.cpp_extension; a C++ compiler, no nvcc) as
   mlafuse/lib/torch_ops.abi3.so, with torch_ops.json beside it naming the torch it was built
   against; it is copied into the source package too. Without torch (or with build isolation,
   whose environment has no torch) it is left out and the package uses its ctypes binding.

Environment: MLAFUSE_CMAKE_ARGS (extra CMake arguments, e.g. "-DMLAF_CUDA=OFF"),
MLAFUSE_BUILD_JOBS (parallel jobs; default: all cores), MLAFUSE_TORCH_EXT (auto: build the
torch extension when torch imports, skipping it with a warning if its build fails; 1: build it
or fail; 0: never).

MLAFUSE_PREBUILT_LIBRARY=/path/libmlafuse.so skips steps 1-2 and bundles that file instead (a
library built from this same checkout, e.g. by scripts/gpu-pack: the package and the library
must agree on the C API); only the torch extension is compiled then.

MLAFUSE_CUDA picks the CUDA backend: unset or "auto" builds it when nvcc is found, "0" (or
"off") builds the CPU backend only (no nvcc run, a small library), "1" (or "on") requires it.
MLAFUSE_CMAKE_ARGS come after it on the CMake line, so a -DMLAF_CUDA there still wins.
"""
import os
import re
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def read_version():
    with open(os.path.join(ROOT, "include", "mlafuse.h")) as f:
        text = f.read()
    parts = [re.search(rf"#define MLAF_VERSION_{k} (\d+)", text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def cuda_mode():
    """MLAF_CUDA for CMake from MLAFUSE_CUDA (see above); a value it does not know is an error,
    not a guess."""
    value = os.environ.get("MLAFUSE_CUDA", "auto").strip().lower()
    modes = {"auto": "AUTO", "": "AUTO", "0": "OFF", "off": "OFF", "false": "OFF", "no": "OFF",
             "1": "ON", "on": "ON", "true": "ON", "yes": "ON"}
    if value not in modes:
        raise RuntimeError(f"MLAFUSE_CUDA={value!r}: expected auto, 0 / off or 1 / on")
    return modes[value]


def build_library():
    pre = os.environ.get("MLAFUSE_PREBUILT_LIBRARY", "").strip()
    if pre:
        if not os.path.isfile(pre):
            raise RuntimeError(f"MLAFUSE_PREBUILT_LIBRARY={pre!r}: no such file")
        return os.path.realpath(pre)
    build_dir = os.path.join(HERE, "build", "cmake")
    cmd = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
           "-DMLAF_BUILD_TESTS=OFF", "-DMLAF_BUILD_TOOLS=OFF", "-DMLAF_BUILD_DEV=OFF",
           # explicit, so a build folder left from an earlier CPU-only install is reset
           "-DMLAF_CUDA=" + cuda_mode()]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        cmd += ["-G", "Ninja"]
    cmd += shlex.split(os.environ.get("MLAFUSE_CMAKE_ARGS", ""))
    subprocess.check_call(cmd)
    jobs = os.environ.get("MLAFUSE_BUILD_JOBS") or str(os.cpu_count() or 1)
    subprocess.check_call(["cmake", "--build", build_dir, "--target", "mlafuse", "-j", jobs])
    lib = os.path.join(build_dir, "libmlafuse.so")
    if not os.path.exists(lib):
        raise RuntimeError(f"CMake did not produce {lib}")
    return os.path.realpath(lib)


class BuildPyWithLibrary(build_py):
    def run(self):
        lib = build_library()
        for pkg_root in (HERE, self.build_lib):
            dst_dir = os.path.join(pkg_root, "mlafuse", "lib")
            os.makedirs(dst_dir, exist_ok=True)
            for old in os.listdir(dst_dir):
                if old.startswith("libmlafuse"):
                    os.remove(os.path.join(dst_dir, old))
            shutil.copyfile(lib, os.path.join(dst_dir, "libmlafuse.so"))
        super().run()


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


# ---- the compiled torch binding (optional) -------------------------------------------------
TORCH_EXT_NAME = "mlafuse.lib.torch_ops"


def torch_ext_mode():
    """"auto", "on" or "off" from MLAFUSE_TORCH_EXT (see above); an unknown value is an error."""
    value = os.environ.get("MLAFUSE_TORCH_EXT", "auto").strip().lower()
    modes = {"auto": "auto", "": "auto", "0": "off", "off": "off", "false": "off", "no": "off",
             "1": "on", "on": "on", "true": "on", "yes": "on"}
    if value not in modes:
        raise RuntimeError(f"MLAFUSE_TORCH_EXT={value!r}: expected auto, 0 / off or 1 / on")
    return modes[value]


def torch_extension():
    """The torch extension to build, or None (no torch here, or MLAFUSE_TORCH_EXT=0)."""
    mode = torch_ext_mode()
    if mode == "off":
        return None, None
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        if mode == "on":
            raise
        return None, None
    # py_limited_api: the extension uses no Python API at all (it registers its ops with the
    # dispatcher and is loaded by torch.ops.load_library), so it does not link libtorch_python.
    sources = [os.path.join("csrc", f) for f in ("mlafuse_torch.cpp", "mlafuse_torch_mla.cpp",
                                                 "mlafuse_torch_moe.cpp",
                                                 "mlafuse_torch_norm.cpp",
                                                 "mlafuse_torch_rowq.cpp",
                                                 "mlafuse_torch_gemm_quant.cpp")]  # + mlafuse_torch.h
    ext = CppExtension(TORCH_EXT_NAME, sources,
                       include_dirs=[os.path.join(ROOT, "include")],
                       extra_compile_args=["-O2", "-g0", "-fvisibility=hidden"], libraries=["dl"],
                       py_limited_api=True)

    class BuildTorchExtension(BuildExtension):
        def run(self):
            src_lib = os.path.join(HERE, "mlafuse", "lib")
            os.makedirs(src_lib, exist_ok=True)
            for old in os.listdir(src_lib):  # a stale build for another torch must not be found
                if old.startswith("torch_ops"):
                    os.remove(os.path.join(src_lib, old))
            if os.environ.get("MLAFUSE_BUILD_JOBS") and not os.environ.get("MAX_JOBS"):
                os.environ["MAX_JOBS"] = os.environ["MLAFUSE_BUILD_JOBS"]
            try:
                super().run()
            except Exception as e:  # noqa: BLE001  (any compiler failure)
                if mode == "on":
                    raise
                print(f"mlafuse: the torch extension was not built ({e}); the package will "
                      "use its ctypes binding", flush=True)
                return
            import json

            import torch

            built = self.get_ext_fullpath(TORCH_EXT_NAME)
            info = {"torch": torch.__version__, "file": os.path.basename(built)}
            for d in {os.path.dirname(built), src_lib}:
                if os.path.abspath(d) != os.path.abspath(os.path.dirname(built)):
                    shutil.copyfile(built, os.path.join(d, os.path.basename(built)))
                with open(os.path.join(d, "torch_ops.json"), "w") as f:
                    json.dump(info, f)

    return ext, BuildTorchExtension


_torch_ext, _build_ext = torch_extension()
_cmdclass = {"build_py": BuildPyWithLibrary}
if _torch_ext is not None:
    _cmdclass["build_ext"] = _build_ext

setup(version=read_version(), cmdclass=_cmdclass, distclass=BinaryDistribution,
      ext_modules=[_torch_ext] if _torch_ext is not None else [])
