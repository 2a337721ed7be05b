"""Builds libmlafuse with CMake from the repository root and bundles it in mlafuse/lib/.

1. CMake configures the repository (the parent of this folder) into python/build/cmake with
   tests, tools and kernel experiments off; CUDA as MLAFUSE_CUDA says (default: on when
   nvcc is found).
2. Only the shared-library target is built.
3. The real library file is copied, as mlafuse/lib/libmlafuse.so, into the source package
   (git-ignored; so a source checkout finds it too) and into the wheel's build directory.
   One file, not the soname symlink chain: wheels would store each link as a full copy.

Environment: MLAFUSE_CMAKE_ARGS (extra CMake arguments, e.g. "-DMLAF_CUDA=OFF"),
MLAFUSE_BUILD_JOBS (parallel jobs; default: all cores).

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


setup(version=read_version(), cmdclass={"build_py": BuildPyWithLibrary},
      distclass=BinaryDistribution)
