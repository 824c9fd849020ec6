#!/usr/bin/env bash
# Build llama.cpp's own llama-bench with CUDA, for the side-by-side of issue 42 item 4, on a machine without a
# GPU; and gather the wheels the GPU machine lacks.  Output (both under build/, which git ignores):
#
#   build/llama-bench-cuda/   llama-bench.xz (stripped, then xz -9) + BUILD.txt: what the device call carries (must
#                             stay under the 64 MiB that travels with the tree, the tree included: stripped, the
#                             binary is 67.8 MB for sm_89 + sm_90, xz makes it 38 MB; scripts/gpu_record.py
#                             unpacks it with Python's lzma on the GPU machine)
#   build/gpu-wheels/         gguf's wheel (the GPU machine's Python has torch, Triton, numpy, tokenizers, not gguf)
#
# The source is the llama.cpp that llama-cpp-python vendors (its sdist's vendor/llama.cpp), so the comparison is
# with the llama.cpp hearth's llama.cpp engine runs.  Choices, and why:
# - CUDA_ARCHS "89-real;90-real": machine code for Ada (4090, L40S) and Hopper (H100, H200) only, no PTX: what the
#   lent GPUs run, at the least size and compile time (each architecture compiles every kernel again).
# - nvcc 13 from /usr/local/cuda: that toolkit is pip's pieces (nvcc, cudart, cccl) without cuBLAS, so cuBLAS's
#   headers and libraries come from the PyPI wheel nvidia-cublas of CUDA 13.0.  The binary links libcublas.so.13
#   and libcublasLt.so.13 dynamically (cuBLASLt alone is 540 MB: it cannot travel); the GPU machine has them in
#   torch's nvidia/cu13/lib, which scripts/gpu_record.py puts on LD_LIBRARY_PATH.  cudart is linked statically
#   (CUDA_cudart_LIBRARY -> libcudart_static.a) and libstdc++/libgcc too: the binary needs no toolkit there.
# - GGML_CUDA_NO_VMM: no libcuda.so to link against here (no driver, no stub); VMM only changes how ggml's
#   memory pool grows.  GGML_OPENMP off (the CPU side does nothing with -ngl 99; no libgomp to find there),
#   GGML_NATIVE off (this CPU is not that machine's), NCCL off (one GPU), no curl/OpenSSL (no downloads).
# - Static ggml and llama (BUILD_SHARED_LIBS=OFF) and only the llama-bench target.
#
#   scripts/build_llama_bench.sh            # JOBS=2 by default; CUDA_ARCHS, LLAMA_CPP_PYTHON, CUBLAS override
#   scripts/build_llama_bench.sh --wheels   # only build/gpu-wheels
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
CUBLAS=${CUBLAS:-13.0.2.14}          # nvidia-cublas of CUDA 13.0, the toolkit's version
CUOBJDUMP=${CUOBJDUMP:-13.2.51}      # nvidia-cuda-cuobjdump: the oldest CUDA 13 one on PyPI; for the check only
GGUF=${GGUF:-0.19.0}
CUDA_ARCHS=${CUDA_ARCHS:-"89-real;90-real"}
JOBS=${JOBS:-2}
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
PIP=${PIP:-$ROOT/.venv/bin/pip}
WORK=$ROOT/build/llama-bench-work    # sources, cuBLAS, the CMake tree: not carried
OUT=$ROOT/build/llama-bench-cuda     # carried
WHEELS=$ROOT/build/gpu-wheels        # carried

log() { printf '[build_llama_bench %(%H:%M:%S)T] %s\n' -1 "$*"; }
PLATFORM=(--only-binary=:all: --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --python-version 3.12 --implementation cp)

fetch_wheels() {
    mkdir -p "$WHEELS"
    if ! ls "$WHEELS"/gguf-"$GGUF"-*.whl >/dev/null 2>&1; then
        "$PIP" download -q --no-deps "${PLATFORM[@]}" "gguf==$GGUF" -d "$WHEELS"
    fi
    log "wheels for the GPU machine: $(ls "$WHEELS")"
}

fetch_sources() {
    mkdir -p "$WORK/dl"
    local sdist="$WORK/dl/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
    [ -f "$sdist" ] || "$PIP" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$WORK/dl"
    SRC="$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
    [ -d "$SRC" ] || tar -xzf "$sdist" -C "$WORK"
    if [ ! -f "$WORK/cublas/lib/libcublasLt.so.13" ]; then
        ls "$WORK"/dl/nvidia_cublas-"$CUBLAS"-*.whl >/dev/null 2>&1 ||
            "$PIP" download -q --no-deps "${PLATFORM[@]}" "nvidia-cublas==$CUBLAS" -d "$WORK/dl"
        rm -rf "$WORK/cublas" "$WORK/unzip" && mkdir -p "$WORK/unzip"
        unzip -q -o "$WORK"/dl/nvidia_cublas-"$CUBLAS"-*.whl 'nvidia/cu13/include/*' 'nvidia/cu13/lib/libcublas*' \
            -d "$WORK/unzip"
        mv "$WORK/unzip/nvidia/cu13" "$WORK/cublas" && rm -rf "$WORK/unzip"
        # the linker looks for libcublas.so / libcublasLt.so; the wheel has only the versioned names
        ln -sf libcublas.so.13 "$WORK/cublas/lib/libcublas.so"
        ln -sf libcublasLt.so.13 "$WORK/cublas/lib/libcublasLt.so"
    fi
    if [ ! -x "$WORK/tools/cuobjdump" ]; then
        ls "$WORK"/dl/nvidia_cuda_cuobjdump-"$CUOBJDUMP"-*.whl >/dev/null 2>&1 ||
            "$PIP" download -q --no-deps "${PLATFORM[@]}" "nvidia-cuda-cuobjdump==$CUOBJDUMP" -d "$WORK/dl"
        mkdir -p "$WORK/tools"
        unzip -q -o -j "$WORK"/dl/nvidia_cuda_cuobjdump-"$CUOBJDUMP"-*.whl 'nvidia/cu13/bin/cuobjdump' -d "$WORK/tools"
        chmod +x "$WORK/tools/cuobjdump"
    fi
}

configure() {
    local nvcc
    nvcc=$(readlink -f "$CUDA_ROOT/bin/nvcc")
    cmake -S "$SRC" -B "$WORK/cmake" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DCUDAToolkit_ROOT="$CUDA_ROOT" \
        -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" \
        -DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF \
        -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCUDA_cudart_LIBRARY="$CUDA_ROOT/lib64/libcudart_static.a" \
        -DCUDA_cublas_LIBRARY="$WORK/cublas/lib/libcublas.so" \
        -DCUDA_cublasLt_LIBRARY="$WORK/cublas/lib/libcublasLt.so" \
        -DCMAKE_CUDA_FLAGS="-I$WORK/cublas/include" \
        -DCMAKE_CXX_FLAGS="-I$WORK/cublas/include" \
        -DCMAKE_CXX_STANDARD_LIBRARIES="-lpthread -ldl -lrt" \
        -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" \
        >"$WORK/configure.log" 2>&1 || { tail -40 "$WORK/configure.log"; exit 1; }
    grep -E "CUDA Toolkit found|Using CMAKE_CUDA_ARCHITECTURES|CUDA host compiler" "$WORK/configure.log" || true
}

build() {
    # A full disk for a moment (other work on this machine can fill it for seconds) fails a compile with "No
    # space left on device": ninja then goes on from where it stopped, up to 30 times.
    : >"$WORK/build.log"
    local try
    for try in $(seq 30); do
        if cmake --build "$WORK/cmake" --target llama-bench -j "$JOBS" >"$WORK/build.try.log" 2>&1; then
            cat "$WORK/build.try.log" >>"$WORK/build.log"
            return 0
        fi
        cat "$WORK/build.try.log" >>"$WORK/build.log"
        grep -q "No space left on device" "$WORK/build.try.log" || { tail -40 "$WORK/build.try.log"; exit 1; }
        log "the disk was full for a moment (try $try); building on in 10 s"
        sleep 10
    done
    log "the disk kept filling up: giving up"
    exit 1
}

check() {
    local bin="$1"
    log "shared libraries it asks for:"
    readelf -d "$bin" | grep NEEDED | sed 's/^/    /'
    local help rc=0
    help=$(LD_LIBRARY_PATH="$WORK/cublas/lib" "$bin" --help 2>&1) || rc=$?
    log "--help here (no GPU; cuBLAS from the wheel): exit $rc, $(echo "$help" | wc -l) lines:"
    echo "$help" | head -6 | sed 's/^/    /'
    log "CUDA machine code in it (cuobjdump --list-elf):"
    "$WORK/tools/cuobjdump" --list-elf "$bin" | sed -E 's/.*\.(sm_[0-9a-z]+)\..*/\1/' | sort | uniq -c | sed 's/^/    /'
}

main() {
    fetch_wheels
    [ "${1:-}" = "--wheels" ] && return 0
    fetch_sources
    log "configuring $SRC for $CUDA_ARCHS"
    configure
    log "building llama-bench with -j$JOBS (log: $WORK/build.log)"
    local began=$SECONDS
    build
    local took=$((SECONDS - began))
    mkdir -p "$OUT"
    rm -f "$OUT/llama-bench"  # an earlier build's uncompressed copy: too big to carry
    local bin="$WORK/llama-bench.stripped"
    strip -o "$bin" "$WORK/cmake/bin/llama-bench"
    xz -9 -T"$JOBS" -c "$bin" >"$OUT/llama-bench.xz.part" && mv "$OUT/llama-bench.xz.part" "$OUT/llama-bench.xz"
    local size
    size=$(stat -c %s "$bin")
    {
        echo "llama-bench from llama-cpp-python $LLAMA_CPP_PYTHON's vendor/llama.cpp"
        echo "nvcc: $("$CUDA_ROOT/bin/nvcc" --version | tail -1); CUDA architectures: $CUDA_ARCHS; cuBLAS $CUBLAS (dynamic)"
        echo "build: $took s with -j$JOBS on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
        echo "size: $size bytes stripped, $(stat -c %s "$OUT/llama-bench.xz") as llama-bench.xz; sha256 of the binary $(sha256sum "$bin" | cut -d' ' -f1)"
        echo "needs at run time: $(readelf -d "$bin" | grep NEEDED | sed -E 's/.*\[(.*)\]/\1/' | xargs)"
    } >"$OUT/BUILD.txt"
    cat "$OUT/BUILD.txt"
    check "$bin"
    log "carried folders: $(du -sh "$OUT" | cut -f1) build/llama-bench-cuda, $(du -sh "$WHEELS" | cut -f1) build/gpu-wheels"
}

main "$@"
