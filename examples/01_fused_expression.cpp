#include <cstdio>
#include <kiln/kiln.hpp>

int main() {
  using namespace kiln;
  Tensor<f32, 2> x = randn<f32>(Shape<2>{512, 1024}, /*seed=*/0);  // evaluated here: x holds samples
  auto y = softmax(gelu(x * 2.0f + 1.0f), -1);                      // an expression: nothing runs yet
  Tensor<f32, 2> out = y;                                           // traced, fused, JIT-compiled, run
  std::printf("%s", explain(Mode::fused, y).c_str());               // the plan: one kernel
  std::printf("out[0][0] = %g, row 0 sums to %g\n", out.to_vector()[0], Tensor<f32, 1>(sum(out, 1)).to_vector()[0]);
}
