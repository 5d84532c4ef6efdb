// Internal to tests/cuda/test_wq_emulate.cpp: one variant of a block-type matmul template (EMU_SRC, with the
// kernel renamed EMU_NAME so each variant has its own C name) compiled for the host in namespace EMU_NS with
// wq_emulate_host.h's helpers; then the variant's macros undefined for the next. (No include guard.)
namespace EMU_NS {
using namespace wqemu;
#define gemm_wq_dp4a_tiled EMU_NAME
#define gemm_wq_dp4a_skinny EMU_NAME
#define gemv_wq_dp4a EMU_NAME
#define gemv_wq_k4_dp4a EMU_NAME
#include EMU_SRC
#undef gemm_wq_dp4a_tiled
#undef gemm_wq_dp4a_skinny
#undef gemv_wq_dp4a
#undef gemv_wq_k4_dp4a
}  // namespace EMU_NS
#undef EMU_NS
#undef EMU_NAME
#undef EMU_SRC
#undef QRIG_WTYPE
#undef QRIG_PLANES
#undef QRIG_BN
#undef QRIG_BT
#undef QRIG_TN
#undef QRIG_TT
#undef QRIG_COLS
#undef QRIG_ROWS
#undef QRIG_SPLIT
#undef QRIG_UNROLL
#undef QRIG_THREADS
#undef WQ_BLOCK
#undef WQ_ABYTES
#undef WQ_BBYTES
#undef WQ_HAS_MIN
#undef WQ_UNITS
#undef WQ_TYPE_ID
#undef WQ_A2
#undef WQ_BWORDS
#undef WQ_SAME32
#undef WQ_SCALE32
