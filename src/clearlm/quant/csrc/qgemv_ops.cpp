// The extension's Python and torch-operator entry points: argument checks, then the kernels of
// qgemv.cpp (exact float32 activations), qgemv_i8.cpp (int8 activations) and qgemv_half.cpp
// (float16 / bfloat16 weights).
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/extension.h>
#include <cstdint>
#include <vector>

// qgemv.cpp
int64_t qgemv_row_bytes(int64_t bits, int64_t K);
int64_t qgemv_fields_words(int64_t nb);
bool qgemv_fields_preferred();
int64_t qgemv_preferred_tile(int64_t bits, int64_t bs);
bool qgemv_is_fields(int64_t bits, int64_t T, const torch::Tensor& codes);
void qmm_run(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
             const torch::Tensor& mn, int64_t bits, int64_t bs, int64_t T, torch::Tensor& y);
void dequant_run(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& mn,
                 int64_t bits, int64_t bs, int64_t T, int64_t r0, torch::Tensor& out);

// qgemv_half.cpp
torch::Tensor hmm(torch::Tensor x, torch::Tensor w);

namespace {

// bits of 4-bit codes valued through IQ4's table (IQ4_NL, IQ4_XS: qgemv.cpp's TABLE4).
constexpr int64_t kTable4 = 14;

// The weight's shape (N, K) and rows per tile T, read off its tensors: row-major codes (N,
// row_bytes) with scales (N, nb), or row tiles of T rows: codes (N/T, nb, T * bpb) with scales
// (N/T, nb, T), or 5-bit codes (N/T, W, T * 32) as bit fields (qgemv.cpp's layouts;
// quant/tiles.py: tile_rows, quant/fields.py), or Q4_K's heads (quant/kheads.py). T is 1, 4
// or 8.
struct Shape {
  int64_t N, K, T;
};

// A K-quant weight with the file's super-block heads (quant/kheads.py): Q4_K, 4-bit codes
// (N, K/2) or (N/T, nb, T * 16) with heads uint8 (N, K/256, 16) or (N/T, K/256, T, 16); Q6_K,
// 6-bit codes (bits 6, scales per 16) uint8 (N, K/64 * 48) or (N/T, K/64, T * 48) in code
// blocks of 64 values, or int8 codes (bits 8) (N, K) or (N/T, nb, T * 16), with heads of 18
// bytes; Q3_K, 3-bit codes (bits 3, scales per 16) as Q6_K's in blocks of 24 bytes, with heads
// of 14 bytes; Q2_K, 2-bit codes (bits 2) in blocks of 16 bytes, with heads of 20; Q5_K, 5-bit
// codes (bits 5) in ggml's Q5 blocks of 20 bytes with Q4_K's heads; IQ4_XS (bits kTable4) as Q4_K with heads of 8 bytes; min empty.
Shape check_heads(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& mn,
                  int64_t bits, int64_t bs) {
  TORCH_CHECK(((bits == 4 || bits == 5 || bits == kTable4) && bs == 32) ||
                  ((bits == 2 || bits == 3 || bits == 6 || bits == 8) && bs == 16),
              "super-block heads need 4/5-bit codes in blocks of 32 or 2/3/6/8-bit codes in "
              "blocks of 16");
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous(), "codes/scale must be contiguous");
  TORCH_CHECK(codes.scalar_type() == (bits == 8 ? torch::kInt8 : torch::kUInt8), "codes dtype");
  TORCH_CHECK(!mn.numel(), "a weight with super-block heads has no min tensor");
  // bytes of a head; of a code block (2/3/6-bit: 64 values, else one scale's values)
  const bool field = bits == 2 || bits == 3 || bits == 6;
  const int64_t hb = bits == 4 || bits == 5 ? 16 : bits == kTable4 ? 8 : bits == 3 ? 14
                     : bits == 2                 ? 20
                                                 : 18;
  const int64_t bpb = field ? 8 * bits : bits == 5 ? 20 : 16;
  TORCH_CHECK((scale.dim() == 3 || scale.dim() == 4) && scale.size(-1) == hb &&
                  codes.dim() == scale.dim() - 1 && codes.size(0) == scale.size(0),
              "heads must be (N, K/256, bytes) with codes (N, row bytes), or row tiles of both");
  const int64_t T = scale.dim() == 4 ? scale.size(2) : 1;
  const int64_t nb = scale.size(1) * (field ? 4 : 256 / bs);  // code blocks per row
  TORCH_CHECK(T == 1 || T == 4 || T == 8, "row tiles must hold 4 or 8 rows");
  TORCH_CHECK(T == 1 ? codes.size(1) == nb * bpb
                     : codes.size(1) == nb && codes.size(2) == T * bpb,
              "codes, heads and block size disagree");
  return {scale.size(0) * T, scale.size(1) * 256, T};
}

Shape check(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& mn,
            int64_t bits, int64_t bs) {
  if (scale.scalar_type() == torch::kByte) return check_heads(codes, scale, mn, bits, bs);
  TORCH_CHECK(bits == 8 || bits == 5 || bits == 4 || bits == kTable4,
              "bits must be 4, 5, 8 or 14");
  TORCH_CHECK(bits != kTable4 || (scale.scalar_type() == torch::kHalf && !mn.numel()),
              "table codes (bits 14) need float16 scales and no min");
  TORCH_CHECK(bits == 8 ? (bs == 16 || bs == 32) : (bs == 32), "unsupported block size");
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous(), "codes/scale must be contiguous");
  TORCH_CHECK(codes.scalar_type() == (bits == 8 ? torch::kInt8 : torch::kUInt8), "codes dtype");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat || scale.scalar_type() == torch::kHalf,
              "scale must be float32 or float16");
  TORCH_CHECK(codes.dim() == scale.dim() && (scale.dim() == 2 || scale.dim() == 3) &&
                  codes.size(0) == scale.size(0),
              "codes and scale must both be row-major (2-d) or both row tiles (3-d)");
  const int64_t T = scale.dim() == 3 ? scale.size(2) : 1, nb = scale.size(1);
  const int64_t bpb = bits == 8 ? bs : bits == 5 ? 20 : 16;
  TORCH_CHECK(T == 1 || T == 4 || T == 8, "row tiles must hold 4 or 8 rows");
  // 5-bit codes in row tiles may be bit fields: W 32-byte words per row (qgemv.cpp, fields.py)
  const bool fields = qgemv_is_fields(bits, T, codes);
  TORCH_CHECK(scale.dim() == 2 ? codes.size(1) == qgemv_row_bytes(bits, nb * bs)
              : fields         ? codes.size(1) == qgemv_fields_words(nb) && codes.size(2) == T * 32
                               : codes.size(1) == nb && codes.size(2) == T * bpb,
              "codes, scale and block size disagree");
  if (mn.numel()) {
    TORCH_CHECK(mn.is_contiguous() && mn.scalar_type() == scale.scalar_type() &&
                    mn.sizes() == scale.sizes(),
                "min must have scale's shape and dtype");
  }
  return {scale.size(0) * T, nb * bs, T};
}

}  // namespace

// x (M, K) float32 contiguous -> (M, N) float32.
torch::Tensor qmm(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor mn,
                  int64_t bits, int64_t bs) {
  const Shape w = check(codes, scale, mn, bits, bs);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be (M, K) float32");
  x = x.contiguous();
  TORCH_CHECK(x.size(1) == w.K, "shape mismatch");
  auto y = torch::empty({x.size(0), w.N}, x.options());
  qmm_run(x, codes, scale, mn, bits, bs, w.T, y);
  return y;
}

// qgemv_i8.cpp: the same product with int8-quantized activations (AVX-512 VNNI or AVX2).
bool qmm_i8_available();
torch::Tensor qmm_i8_impl(const torch::Tensor& x, const torch::Tensor& codes,
                          const torch::Tensor& scale, const torch::Tensor& mn, int64_t bits,
                          int64_t bs, int64_t N, int64_t T, std::vector<int64_t>& exact_rows);

torch::Tensor qmm_i8(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor mn,
                     int64_t bits, int64_t bs) {
  const Shape w = check(codes, scale, mn, bits, bs);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be (M, K) float32");
  x = x.contiguous();
  TORCH_CHECK(x.size(1) == w.K, "shape mismatch");
  // exact: 5-bit bit fields, Q6_K's, Q3_K's and Q2_K's field codes and IQ4's table codes have
  // no int8 body
  if (qgemv_is_fields(bits, w.T, codes) || bits == 6 || bits == 3 || bits == 2 ||
      bits == kTable4) {
    return qmm(x, codes, scale, mn, bits, bs);
  }
  std::vector<int64_t> exact_rows;  // rows with a block max |x| outside the int8 path's range
  auto y = qmm_i8_impl(x, codes, scale, mn, bits, bs, w.N, w.T, exact_rows);
  for (const int64_t m : exact_rows) {
    torch::Tensor ym = y.narrow(0, m, 1);  // (1, N), contiguous
    qmm_run(x.narrow(0, m, 1), codes, scale, mn, bits, bs, w.T, ym);
  }
  return y;
}

// Rows [r0, r1) of the dequantized weight, (r1 - r0, K) float32.
torch::Tensor dequant(torch::Tensor codes, torch::Tensor scale, torch::Tensor mn, int64_t bits,
                      int64_t bs, int64_t r0, int64_t r1) {
  const Shape w = check(codes, scale, mn, bits, bs);
  TORCH_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.N, "row range out of bounds");
  auto out = torch::empty({r1 - r0, w.K}, torch::dtype(torch::kFloat));
  dequant_run(codes, scale, mn, bits, bs, w.T, r0, out);
  return out;
}

// Every row of the dequantized weight, (N, K) float32: the operator an embedding lookup of
// K-quant heads or IQ4's table codes calls while traced (quant/embedding.py), on the rows it
// gathered.
torch::Tensor dequant_all(torch::Tensor codes, torch::Tensor scale, torch::Tensor mn,
                          int64_t bits, int64_t bs) {
  const Shape w = check(codes, scale, mn, bits, bs);
  return dequant(codes, scale, mn, bits, bs, 0, w.N);
}

// The operators as AOTInductor C shims: a package built with
// aot_inductor.custom_ops_to_c_shims (clearlm/aot_build.py) calls these directly, by the name
// Inductor derives from the operator (aoti_torch_<device>_<name>), instead of going through
// its proxy executor (an IValue stack and a boxed dispatcher call per product). The symbols are
// found at the package's load because clearlm.aot reopens this library RTLD_GLOBAL first.
namespace {
using Product = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                                  int64_t, int64_t);

// Tensor handles in, the product's new tensor handle out; an exception becomes an error code.
template <Product product>
AOTITorchError as_shim(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scale,
                       AtenTensorHandle mn, int64_t bits, int64_t bs, AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor y = product(*tensor_handle_to_tensor_pointer(x),
                           *tensor_handle_to_tensor_pointer(codes),
                           *tensor_handle_to_tensor_pointer(scale),
                           *tensor_handle_to_tensor_pointer(mn), bits, bs);
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(y));
  });
}
}  // namespace

extern "C" {
AOTITorchError aoti_torch_cpu_qmm(AtenTensorHandle x, AtenTensorHandle codes,
                                  AtenTensorHandle scale, AtenTensorHandle mn, int64_t bits,
                                  int64_t bs, AtenTensorHandle* ret0) {
  return as_shim<qmm>(x, codes, scale, mn, bits, bs, ret0);
}

// x (M, K) float32, w (N, K) float16 / bfloat16 -> (M, N) float32 (qgemv_half.cpp).
AOTITorchError aoti_torch_cpu_hmm(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor y = hmm(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w));
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(y));
  });
}

// codes, scale, mn -> (N, K) float32 (dequant_all).
AOTITorchError aoti_torch_cpu_dequant(AtenTensorHandle codes, AtenTensorHandle scale,
                                      AtenTensorHandle mn, int64_t bits, int64_t bs,
                                      AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor y = dequant_all(*tensor_handle_to_tensor_pointer(codes),
                               *tensor_handle_to_tensor_pointer(scale),
                               *tensor_handle_to_tensor_pointer(mn), bits, bs);
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(y));
  });
}

AOTITorchError aoti_torch_cpu_qmm_i8(AtenTensorHandle x, AtenTensorHandle codes,
                                     AtenTensorHandle scale, AtenTensorHandle mn, int64_t bits,
                                     int64_t bs, AtenTensorHandle* ret0) {
  return as_shim<qmm_i8>(x, codes, scale, mn, bits, bs, ret0);
}
}

// The same products (and the dequantization) as torch operators (torch.ops.clearlm_kernels.qmm,
// .qmm_i8, .hmm, .dequant), so a torch.compile'd graph calls them through the dispatcher with no
// Python in between; their shape functions (register_fake) are in clearlm/quant/ops.py and
// quant/half.py.
TORCH_LIBRARY(clearlm_kernels, m) {
  m.def("qmm(Tensor x, Tensor codes, Tensor scale, Tensor mn, int bits, int bs) -> Tensor");
  m.def("qmm_i8(Tensor x, Tensor codes, Tensor scale, Tensor mn, int bits, int bs) -> Tensor");
  m.def("hmm(Tensor x, Tensor w) -> Tensor");
  m.def("dequant(Tensor codes, Tensor scale, Tensor mn, int bits, int bs) -> Tensor");
}

TORCH_LIBRARY_IMPL(clearlm_kernels, CPU, m) {
  m.impl("qmm", &qmm);
  m.impl("qmm_i8", &qmm_i8);
  m.impl("hmm", &hmm);
  m.impl("dequant", &dequant_all);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("qmm", &qmm, "y = x @ dequant(W).T for block-quantized W");
  m.def("qmm_i8", &qmm_i8,
        "qmm with activations rounded to int8 per block of 32 (AVX-512 VNNI or AVX2)");
  m.def("qmm_i8_available", &qmm_i8_available, "whether qmm_i8 was built (AVX-512 VNNI or AVX2)");
  m.def("hmm", &hmm, "y = x @ W.T for W float16 or bfloat16 (N, K), x float32 (M, K)");
  m.def("dequant", &dequant, "rows [r0, r1) of dequant(W) as float32");
  m.def("fields_preferred", &qgemv_fields_preferred,
        "whether row tiles hold 5-bit codes as bit fields on this build (not on AVX-512)");
  m.def("preferred_tile", &qgemv_preferred_tile,
        "rows per row tile for (bits, block size) codes on this build (4 or 8)");
}
