// Internal to tests/cuda/test_wq_emulate.cpp: the emulated variants of the block-type matmul templates, each
// compiled for the host in its own namespace by wq_emulate_one.h (after the host macros that file defines). (No
// include guard: included once.)
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
#define QRIG_WTYPE 12
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_k_w12_p2_r2
#define EMU_NAME emu_k_w12_p2_r2
#define EMU_SRC "templates/gemv_wq_k4_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 2
#define QRIG_ROWS 2
#define QRIG_THREADS 128
#define EMU_NS ns_emu_k_w13_p2_r2
#define EMU_NAME emu_k_w13_p2_r2
#define EMU_SRC "templates/gemv_wq_k4_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 12
#define QRIG_PLANES 1
#define QRIG_ROWS 4
#define QRIG_THREADS 128
#define EMU_NS ns_emu_k_w12_p1_r4
#define EMU_NAME emu_k_w12_p1_r4
#define EMU_SRC "templates/gemv_wq_k4_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"
#define QRIG_WTYPE 13
#define QRIG_PLANES 1
#define QRIG_ROWS 1
#define QRIG_THREADS 64
#define EMU_NS ns_emu_k_w13_p1_r1
#define EMU_NAME emu_k_w13_p1_r1
#define EMU_SRC "templates/gemv_wq_k4_dp4a.cu"
#include "tests/cuda/wq_emulate_one.h"

