// Internal to tests/cuda/test_wq_decode.cpp: templates/qrig_wtypes.cuh for the host, for the type QRIG_WTYPE, in
// namespace WQ_NS; then its macros undefined for the next type. (No include guard: included once per type.)
namespace WQ_NS {
using namespace wqhost;
#include "templates/qrig_wtypes.cuh"
}  // namespace WQ_NS
#undef QRIG_WTYPE
#undef WQ_NS
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
