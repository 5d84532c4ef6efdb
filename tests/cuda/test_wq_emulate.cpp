// CI without a GPU: the block-type matmul kernels (templates/gemm_wq_dp4a_skinny.cu, gemm_wq_dp4a_tiled.cu,
// gemv_wq_dp4a.cu) run on
// the host, every CUDA thread of a CTA a std::thread (tests/cuda/wq_emulate_host.h: __syncthreads a barrier, the
// warp sum an exchange through memory), for every block type: two tilings of the tiled GEMM (64 x 32 one plane,
// 128 x 64 two planes: partial row and token tiles, several 128-value stages), the skinny kernel as
// GEMV (c1 r2, two planes: rows whose units do not fill the last step of 32 lanes) and at a skinny width (c8 r1,
// 5 of 8 tokens), the decode GEMV gemv_wq_dp4a (r2 s2 u2, two planes: two warps per row, partial steps),
// against the float64 product of gguf::dequantize's weights (an independent decode) and the kernels' activation
// x = xd * (xq + xq2/254), outputs poisoned with NaN. This checks what a GPU run would of the kernels' index
// arithmetic, decode use, scale and offset terms, clamping and stores; not what only a GPU has (the memory
// model, races across warps without a barrier, registers): tests/gpu/test_gpu_wq.cpp does.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "kernels/matmul.h"
#include "runtime/cuda/q8_layout.h"
#include "tests/cuda/wq_emulate_host.h"

#define __device__
#define __forceinline__ inline
#define __restrict__
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define QRIG_HOST_EMULATION 1
#define QRIG_SM 70

#define QRIG_WTYPE 2
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w2
#define EMU_NAME emu_t1_w2
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 2
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w2
#define EMU_NAME emu_t2_w2
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 2
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w2
#define EMU_NAME emu_s1_w2
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 2
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w2
#define EMU_NAME emu_s2_w2
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 3
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w3
#define EMU_NAME emu_t1_w3
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 3
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w3
#define EMU_NAME emu_t2_w3
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 3
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w3
#define EMU_NAME emu_s1_w3
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 3
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w3
#define EMU_NAME emu_s2_w3
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 6
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w6
#define EMU_NAME emu_t1_w6
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 6
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w6
#define EMU_NAME emu_t2_w6
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 6
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w6
#define EMU_NAME emu_s1_w6
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 6
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w6
#define EMU_NAME emu_s2_w6
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 7
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w7
#define EMU_NAME emu_t1_w7
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 7
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w7
#define EMU_NAME emu_t2_w7
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 7
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w7
#define EMU_NAME emu_s1_w7
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 7
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w7
#define EMU_NAME emu_s2_w7
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 10
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w10
#define EMU_NAME emu_t1_w10
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 10
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w10
#define EMU_NAME emu_t2_w10
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 10
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w10
#define EMU_NAME emu_s1_w10
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 10
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w10
#define EMU_NAME emu_s2_w10
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 11
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w11
#define EMU_NAME emu_t1_w11
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 11
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w11
#define EMU_NAME emu_t2_w11
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 11
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w11
#define EMU_NAME emu_s1_w11
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 11
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w11
#define EMU_NAME emu_s2_w11
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w12
#define EMU_NAME emu_t1_w12
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w12
#define EMU_NAME emu_t2_w12
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w12
#define EMU_NAME emu_s1_w12
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w12
#define EMU_NAME emu_s2_w12
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w13
#define EMU_NAME emu_t1_w13
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w13
#define EMU_NAME emu_t2_w13
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w13
#define EMU_NAME emu_s1_w13
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w13
#define EMU_NAME emu_s2_w13
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 14
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w14
#define EMU_NAME emu_t1_w14
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 14
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w14
#define EMU_NAME emu_t2_w14
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 14
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w14
#define EMU_NAME emu_s1_w14
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 14
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w14
#define EMU_NAME emu_s2_w14
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 20
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w20
#define EMU_NAME emu_t1_w20
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 20
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w20
#define EMU_NAME emu_t2_w20
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 20
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w20
#define EMU_NAME emu_s1_w20
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 20
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w20
#define EMU_NAME emu_s2_w20
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 23
#define QRIG_PLANES 1
#define QRIG_BN 64
#define QRIG_BT 32
#define QRIG_TN 4
#define QRIG_TT 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_t1_w23
#define EMU_NAME emu_t1_w23
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 23
#define QRIG_PLANES 2
#define QRIG_BN 128
#define QRIG_BT 64
#define QRIG_TN 8
#define QRIG_TT 4
#define QRIG_THREADS 256
#define EMU_NS ns_emu_t2_w23
#define EMU_NAME emu_t2_w23
#define EMU_SRC "templates/gemm_wq_dp4a_tiled.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 23
#define QRIG_PLANES 2
#define QRIG_COLS 1
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s1_w23
#define EMU_NAME emu_s1_w23
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 23
#define QRIG_PLANES 1
#define QRIG_COLS 8
#define QRIG_ROWS 1
#define QRIG_THREADS 128
#define EMU_NS ns_emu_s2_w23
#define EMU_NAME emu_s2_w23
#define EMU_SRC "templates/gemm_wq_dp4a_skinny.cu"
#include "tests/cuda/wq_emulate_one.h"

#define QRIG_WTYPE 2
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w2
#define EMU_NAME emu_g_w2
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 3
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w3
#define EMU_NAME emu_g_w3
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 6
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w6
#define EMU_NAME emu_g_w6
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 7
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w7
#define EMU_NAME emu_g_w7
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 10
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w10
#define EMU_NAME emu_g_w10
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 11
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w11
#define EMU_NAME emu_g_w11
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w12
#define EMU_NAME emu_g_w12
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w13
#define EMU_NAME emu_g_w13
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 14
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w14
#define EMU_NAME emu_g_w14
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 20
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w20
#define EMU_NAME emu_g_w20
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 23
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_SPLIT 2
#define QRIG_UNROLL 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_g_w23
#define EMU_NAME emu_g_w23
#define EMU_SRC "templates/gemv_wq_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"

#undef __shared__

namespace {

using namespace qrig;
using Kernel = void (*)(const unsigned char*, const unsigned char*, const signed char*, const float*, const signed char*,
                        float*, int, int, int);
using GemvKernel = void (*)(const unsigned char*, const unsigned char*, const signed char*, const float*,
                            const signed char*, float*, int, int);
// gemv_wq_dp4a r2 s2 u2 t128, two planes: 2 groups of 2 warps per CTA, a lane's second unit past the row's end.
const std::vector<std::pair<int64_t, GemvKernel>> kGemvEmu = {
    {2, ns_emu_g_w2::emu_g_w2},
    {3, ns_emu_g_w3::emu_g_w3},
    {6, ns_emu_g_w6::emu_g_w6},
    {7, ns_emu_g_w7::emu_g_w7},
    {10, ns_emu_g_w10::emu_g_w10},
    {11, ns_emu_g_w11::emu_g_w11},
    {12, ns_emu_g_w12::emu_g_w12},
    {13, ns_emu_g_w13::emu_g_w13},
    {14, ns_emu_g_w14::emu_g_w14},
    {20, ns_emu_g_w20::emu_g_w20},
    {23, ns_emu_g_w23::emu_g_w23},
};
struct Emu {
  int64_t type;
  bool tiled;
  int planes, bn, bt, cols, rows, threads;
  const char* name;
  Kernel kernel;
  GemvKernel gemv = nullptr;  // gemv_wq_dp4a (cols 1, rows per group, split warps per row)
  int split = 0;
};
const std::vector<Emu> kEmu = {
    {2, true, 1, 64, 32, 0, 0, 128, "emu_t1_w2", ns_emu_t1_w2::emu_t1_w2},
    {2, true, 2, 128, 64, 0, 0, 256, "emu_t2_w2", ns_emu_t2_w2::emu_t2_w2},
    {2, false, 2, 0, 0, 1, 2, 128, "emu_s1_w2", ns_emu_s1_w2::emu_s1_w2},
    {2, false, 1, 0, 0, 8, 1, 128, "emu_s2_w2", ns_emu_s2_w2::emu_s2_w2},
    {3, true, 1, 64, 32, 0, 0, 128, "emu_t1_w3", ns_emu_t1_w3::emu_t1_w3},
    {3, true, 2, 128, 64, 0, 0, 256, "emu_t2_w3", ns_emu_t2_w3::emu_t2_w3},
    {3, false, 2, 0, 0, 1, 2, 128, "emu_s1_w3", ns_emu_s1_w3::emu_s1_w3},
    {3, false, 1, 0, 0, 8, 1, 128, "emu_s2_w3", ns_emu_s2_w3::emu_s2_w3},
    {6, true, 1, 64, 32, 0, 0, 128, "emu_t1_w6", ns_emu_t1_w6::emu_t1_w6},
    {6, true, 2, 128, 64, 0, 0, 256, "emu_t2_w6", ns_emu_t2_w6::emu_t2_w6},
    {6, false, 2, 0, 0, 1, 2, 128, "emu_s1_w6", ns_emu_s1_w6::emu_s1_w6},
    {6, false, 1, 0, 0, 8, 1, 128, "emu_s2_w6", ns_emu_s2_w6::emu_s2_w6},
    {7, true, 1, 64, 32, 0, 0, 128, "emu_t1_w7", ns_emu_t1_w7::emu_t1_w7},
    {7, true, 2, 128, 64, 0, 0, 256, "emu_t2_w7", ns_emu_t2_w7::emu_t2_w7},
    {7, false, 2, 0, 0, 1, 2, 128, "emu_s1_w7", ns_emu_s1_w7::emu_s1_w7},
    {7, false, 1, 0, 0, 8, 1, 128, "emu_s2_w7", ns_emu_s2_w7::emu_s2_w7},
    {10, true, 1, 64, 32, 0, 0, 128, "emu_t1_w10", ns_emu_t1_w10::emu_t1_w10},
    {10, true, 2, 128, 64, 0, 0, 256, "emu_t2_w10", ns_emu_t2_w10::emu_t2_w10},
    {10, false, 2, 0, 0, 1, 2, 128, "emu_s1_w10", ns_emu_s1_w10::emu_s1_w10},
    {10, false, 1, 0, 0, 8, 1, 128, "emu_s2_w10", ns_emu_s2_w10::emu_s2_w10},
    {11, true, 1, 64, 32, 0, 0, 128, "emu_t1_w11", ns_emu_t1_w11::emu_t1_w11},
    {11, true, 2, 128, 64, 0, 0, 256, "emu_t2_w11", ns_emu_t2_w11::emu_t2_w11},
    {11, false, 2, 0, 0, 1, 2, 128, "emu_s1_w11", ns_emu_s1_w11::emu_s1_w11},
    {11, false, 1, 0, 0, 8, 1, 128, "emu_s2_w11", ns_emu_s2_w11::emu_s2_w11},
    {12, true, 1, 64, 32, 0, 0, 128, "emu_t1_w12", ns_emu_t1_w12::emu_t1_w12},
    {12, true, 2, 128, 64, 0, 0, 256, "emu_t2_w12", ns_emu_t2_w12::emu_t2_w12},
    {12, false, 2, 0, 0, 1, 2, 128, "emu_s1_w12", ns_emu_s1_w12::emu_s1_w12},
    {12, false, 1, 0, 0, 8, 1, 128, "emu_s2_w12", ns_emu_s2_w12::emu_s2_w12},
    {13, true, 1, 64, 32, 0, 0, 128, "emu_t1_w13", ns_emu_t1_w13::emu_t1_w13},
    {13, true, 2, 128, 64, 0, 0, 256, "emu_t2_w13", ns_emu_t2_w13::emu_t2_w13},
    {13, false, 2, 0, 0, 1, 2, 128, "emu_s1_w13", ns_emu_s1_w13::emu_s1_w13},
    {13, false, 1, 0, 0, 8, 1, 128, "emu_s2_w13", ns_emu_s2_w13::emu_s2_w13},
    {14, true, 1, 64, 32, 0, 0, 128, "emu_t1_w14", ns_emu_t1_w14::emu_t1_w14},
    {14, true, 2, 128, 64, 0, 0, 256, "emu_t2_w14", ns_emu_t2_w14::emu_t2_w14},
    {14, false, 2, 0, 0, 1, 2, 128, "emu_s1_w14", ns_emu_s1_w14::emu_s1_w14},
    {14, false, 1, 0, 0, 8, 1, 128, "emu_s2_w14", ns_emu_s2_w14::emu_s2_w14},
    {20, true, 1, 64, 32, 0, 0, 128, "emu_t1_w20", ns_emu_t1_w20::emu_t1_w20},
    {20, true, 2, 128, 64, 0, 0, 256, "emu_t2_w20", ns_emu_t2_w20::emu_t2_w20},
    {20, false, 2, 0, 0, 1, 2, 128, "emu_s1_w20", ns_emu_s1_w20::emu_s1_w20},
    {20, false, 1, 0, 0, 8, 1, 128, "emu_s2_w20", ns_emu_s2_w20::emu_s2_w20},
    {23, true, 1, 64, 32, 0, 0, 128, "emu_t1_w23", ns_emu_t1_w23::emu_t1_w23},
    {23, true, 2, 128, 64, 0, 0, 256, "emu_t2_w23", ns_emu_t2_w23::emu_t2_w23},
    {23, false, 2, 0, 0, 1, 2, 128, "emu_s1_w23", ns_emu_s1_w23::emu_s1_w23},
    {23, false, 1, 0, 0, 8, 1, 128, "emu_s2_w23", ns_emu_s2_w23::emu_s2_w23},
};

std::vector<int> half_offsets(int64_t t) {  // the block's fp16 scales (d, dmin), set to finite values
  switch (t) {
    case 3: case 7: case 12: case 13: return {0, 2};
    case 10: return {80, 82};
    case 11: return {108};
    case 14: return {208};
    default: return {0};
  }
}

}  // namespace

TEST_CASE("the block-type matmul kernels run on host threads match the float64 product of the dequantized weights",
          "[cuda][wq]") {
  std::mt19937_64 rng(20261202);
  std::vector<Emu> all = kEmu;
  for (const auto& [t, k] : kGemvEmu) all.push_back({t, false, 2, 0, 0, 1, 2, 128, "emu_g", nullptr, k, 2});
  for (const Emu& e : all) {
    INFO(e.name << " type " << e.type);
    const kernels::WqLayout l = kernels::wq_layout(e.type);
    // K: whole 128-value stages (tiled); for the GEMV a row whose units do not fill the last step of 32 lanes.
    const int64_t K = e.tiled ? 512 : (l.block_values == 32 ? 4128 : 4352), N = 70;
    const int64_t T = e.tiled ? 40 : e.gemv ? 1 : 5;
    const size_t blocks = (size_t)(N * K / l.block_values);
    std::vector<uint8_t> src(blocks * (size_t)l.block_bytes);
    for (auto& c : src) c = (uint8_t)rng();
    std::uniform_real_distribution<float> scale(0.001f, 0.01f);
    for (size_t i = 0; i < blocks; ++i)
      for (int off : half_offsets(e.type)) {
        const uint16_t h = gguf::float_to_fp16(scale(rng));
        std::memcpy(src.data() + i * (size_t)l.block_bytes + off, &h, 2);
      }
    std::vector<wqemu::int4> abuf(blocks * (size_t)l.a_bytes / 16 + 1), bbuf(blocks * (size_t)l.b_bytes() / 16 + 2);
    auto* a = reinterpret_cast<uint8_t*>(abuf.data());
    auto* b = reinterpret_cast<uint8_t*>(bbuf.data());
    cuda::repack_wq(e.type, src.data(), N, K, a, b);
    std::vector<float> w((size_t)(N * K));
    gguf::dequantize((gguf::TensorType)e.type, src.data(), w.data(), w.size());
    std::vector<wqemu::int4> xqb((size_t)(T * K / 16)), xq2b((size_t)(T * K / 16));
    auto* xq = reinterpret_cast<signed char*>(xqb.data());
    auto* xq2 = reinterpret_cast<signed char*>(xq2b.data());
    std::vector<float> xd((size_t)(T * K / 32));
    for (int64_t i = 0; i < T * K; ++i) {
      xq[i] = (signed char)((int)(rng() % 255) - 127);
      xq2[i] = (signed char)((int)(rng() % 255) - 127);
    }
    for (auto& d : xd) d = 0.001f * (float)(1 + rng() % 100);
    std::vector<float> y((size_t)(T * N), std::nanf(""));
    if (e.tiled) {
      wqemu::launch((unsigned)((T + e.bt - 1) / e.bt), (unsigned)((N + e.bn - 1) / e.bn), e.threads, [&] {
        e.kernel(a, b, xq, xd.data(), xq2, y.data(), (int)K, (int)N, (int)T);
      });
    } else if (e.gemv) {
      const int64_t per_block = e.rows * (e.threads / 32) / e.split;
      wqemu::launch((unsigned)((N + per_block - 1) / per_block), 1, e.threads,
                    [&] { e.gemv(a, b, xq, xd.data(), xq2, y.data(), (int)K, (int)N); });
    } else {
      const int64_t per_block = e.rows * (e.threads / 32);
      for (int64_t t0 = 0; t0 < T; t0 += e.cols)
        wqemu::launch((unsigned)((N + per_block - 1) / per_block), 1, e.threads, [&] {
          e.kernel(a, b, xq + t0 * K, xd.data() + t0 * (K / 32), xq2 + t0 * K, y.data() + t0 * N, (int)K, (int)N,
                   (int)std::min<int64_t>(e.cols, T - t0));
        });
    }
    double err = 0, ref_max = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < N; ++r) {
        double s = 0;
        for (int64_t i = 0; i < K; ++i) {
          const size_t x = (size_t)(t * K + i);
          const double v = e.planes == 2 ? (double)xd[x / 32] * std::fma((float)xq2[x], 1.0f / 254.0f, (float)xq[x])
                                         : (double)xd[x / 32] * (double)xq[x];
          s += (double)w[(size_t)(r * K + i)] * v;
        }
        const float got = y[(size_t)(t * N + r)];
        REQUIRE(got == got);  // every output written
        err = std::max(err, std::fabs((double)got - s));
        ref_max = std::max(ref_max, std::fabs(s));
      }
    CHECK(ref_max > 0);
    CHECK(err / ref_max < 2e-6);  // fp32 rounding only (measured ~3e-7)
  }
}
