"""Builds hybridtf's TensorFlow op library from kernels/ with g++ (and nvcc).

Used by setup.py (``pip install .`` / ``pip install -e .``) and runnable on its
own for a fast rebuild during development::

    python tools/build_ops.py                 # -> hybridtf/_src/run/_hybridtf_ops.so
    HYBRIDTF_CUDA=0 python tools/build_ops.py # CPU only even if nvcc is found

Sources are discovered by file role (see CONVENTIONS.md):

* ``kernels/**/*.cc`` (not ``*.cu.cc``, not ``kernels/python``): op definitions,
  CPU kernels and the TF-free CPU implementation layer, compiled with g++ and
  ``tf.sysconfig`` flags.
* ``kernels/**/*_impl.cu``: the TF-free CUDA implementation layer (nvcc).
* ``kernels/**/*.cu.cc``: GPU OpKernels (nvcc, TF headers, ``GOOGLE_CUDA=1``).

CUDA is built when ``HYBRIDTF_CUDA`` is ``1``, or ``auto`` (default) and nvcc
is found. The CUDA objects are linked into the same library together with a
static CUDA runtime whose symbols stay private to the library.

The library embeds a build record (``HYBRIDTF_BUILD_INFO:{json}:END`` in its
read-only data: TensorFlow version, CUDA, sources); the loader
(hybridtf/_src/run/loader.py) reads it from the file before loading and
refuses a library built for another TensorFlow with a message naming the fix.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
DEFAULT_OUT = ROOT / "hybridtf" / "_src" / "run" / ("_hybridtf_ops" + sysconfig.get_config_var("EXT_SUFFIX"))
CXX_FLAGS = ["-O3", "-fno-math-errno", "-DNDEBUG", "-fPIC", "-Wall", "-Wno-sign-compare", "-fvisibility=hidden"]
DEFAULT_CUDA_ARCHS = "80;90"


class BuildError(RuntimeError):
    """A compiler or linker step failed; the message holds its command and output."""


def cpu_sources() -> list[pathlib.Path]:
    return sorted(
        p
        for p in KERNELS.rglob("*.cc")
        if not p.name.endswith(".cu.cc")
        and not p.name.endswith("_test.cc")
        and "python" not in p.relative_to(KERNELS).parts
    )


def cuda_sources() -> list[pathlib.Path]:
    impl = sorted(KERNELS.rglob("*_impl.cu"))
    ops = sorted(KERNELS.rglob("*.cu.cc"))
    return impl + ops


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = pathlib.Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def cuda_lib_dir(nvcc: str) -> pathlib.Path:
    """Where libcudart_static.a lives: $CUDA_HOME / $CUDA_PATH, beside nvcc, or /usr/local/cuda."""
    roots = [pathlib.Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += [pathlib.Path(nvcc).resolve().parent.parent, pathlib.Path("/usr/local/cuda")]
    for root in roots:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            if (root / sub / "libcudart_static.a").is_file():
                return root / sub
    raise BuildError(
        f"libcudart_static.a not found under {[str(r) for r in roots]}; set CUDA_HOME to the CUDA toolkit."
    )


def want_cuda(nvcc: str | None) -> bool:
    mode = os.environ.get("HYBRIDTF_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return False
    if mode in ("1", "on", "yes", "true"):
        if nvcc is None:
            raise BuildError("HYBRIDTF_CUDA=1 but nvcc was not found; install the CUDA toolkit or unset it.")
        return True
    if mode != "auto":
        raise BuildError(f"HYBRIDTF_CUDA must be auto, 0 or 1, got {mode!r}.")
    return nvcc is not None


def tf_flags() -> tuple[list[str], list[str], str]:
    import tensorflow as tf

    return tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(), tf.__version__


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}):\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _headers_mtime() -> float:
    return max((p.stat().st_mtime for p in KERNELS.rglob("*.h")), default=0.0)


def _stale(src: pathlib.Path, obj: pathlib.Path, headers_mtime: float) -> bool:
    if not obj.exists():
        return True
    return obj.stat().st_mtime < max(src.stat().st_mtime, headers_mtime)


def compile_commands(
    build_dir: pathlib.Path, cuda: bool, nvcc: str | None
) -> list[tuple[pathlib.Path, pathlib.Path, list[str]]]:
    cflags, _, _ = tf_flags()
    cxx = os.environ.get("CXX", "g++")
    defines = ["-DGOOGLE_CUDA=1"] if cuda else []
    jobs = []
    for src in cpu_sources():
        obj = build_dir / (src.relative_to(ROOT).as_posix().replace("/", "__") + ".o")
        jobs.append((src, obj, [cxx, *CXX_FLAGS, *cflags, *defines, f"-I{ROOT}", "-c", str(src), "-o", str(obj)]))
    if cuda:
        archs = os.environ.get("HYBRIDTF_CUDA_ARCHS", DEFAULT_CUDA_ARCHS).split(";")
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs if a]
        gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
        for src in cuda_sources():
            obj = build_dir / (src.relative_to(ROOT).as_posix().replace("/", "__") + ".o")
            is_tf = src.name.endswith(".cu.cc")
            flags = [*cflags, "-DGOOGLE_CUDA=1", "-DEIGEN_USE_GPU"] if is_tf else ["-std=c++17"]
            jobs.append(
                (
                    src,
                    obj,
                    [
                        nvcc,
                        "-x",
                        "cu",
                        "-O3",
                        "-DNDEBUG",
                        *gencode,
                        "-Xcompiler",
                        "-fPIC,-fvisibility=hidden",
                        "--expt-relaxed-constexpr",
                        *flags,
                        f"-I{ROOT}",
                        "-c",
                        str(src),
                        "-o",
                        str(obj),
                    ],
                )
            )
    return jobs


def build_info_source(info: dict) -> str:
    """C++ source that embeds ``info`` in the library (read by the loader)."""
    text = json.dumps(info, sort_keys=True).replace("\\", "\\\\").replace('"', '\\"')
    return (
        "// Generated by tools/build_ops.py: the build record the loader reads.\n"
        'extern "C" __attribute__((used, visibility("default"))) const char hybridtf_build_info[] =\n'
        f'    "HYBRIDTF_BUILD_INFO:{text}:END";\n'
    )


def _build_info_object(build_dir: pathlib.Path, info: dict) -> pathlib.Path:
    src = build_dir / "build_info.cc"
    src.write_text(build_info_source(info))
    obj = build_dir / "build_info.o"
    _run([os.environ.get("CXX", "g++"), "-fPIC", "-c", str(src), "-o", str(obj)])
    return obj


def build(
    out: pathlib.Path = DEFAULT_OUT,
    build_dir: pathlib.Path | None = None,
    jobs: int | None = None,
    verbose: bool = False,
) -> pathlib.Path:
    """Compiles and links the op library to ``out``; returns its path."""
    out = pathlib.Path(out).resolve()
    nvcc = find_nvcc()
    cuda = want_cuda(nvcc)
    build_dir = pathlib.Path(build_dir or ROOT / "build" / ("ops-cuda" if cuda else "ops-cpu"))
    build_dir.mkdir(parents=True, exist_ok=True)
    _, lflags, tf_version = tf_flags()
    commands = compile_commands(build_dir, cuda, nvcc)
    hm = _headers_mtime()
    todo = [c for c in commands if _stale(c[0], c[1], hm)]
    workers = jobs or os.cpu_count() or 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        if verbose:
            for src, _, _ in todo:
                print("compiling", src.relative_to(ROOT), flush=True)
        list(pool.map(lambda c: _run(c[2]), todo))
    info = {
        "tensorflow_version": tf_version,
        "cuda": cuda,
        "cuda_archs": os.environ.get("HYBRIDTF_CUDA_ARCHS", DEFAULT_CUDA_ARCHS) if cuda else "",
        "sources": [str(c[0].relative_to(ROOT)) for c in commands],
    }
    objects = [str(c[1]) for c in commands] + [str(_build_info_object(build_dir, info))]
    link = [os.environ.get("CXX", "g++"), "-shared", "-o", str(out), *objects, *lflags]
    if cuda:
        cuda_lib = cuda_lib_dir(nvcc)
        link += [f"-L{cuda_lib}", "-Wl,--exclude-libs,ALL", "-lcudart_static", "-lrt", "-ldl", "-lpthread"]
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(link)
    if verbose:
        print(f"built {out} (cuda={cuda}, tensorflow {tf_version})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        build(args.out, jobs=args.jobs, verbose=True)
    except BuildError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
