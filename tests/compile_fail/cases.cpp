// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Mistakes kiln turns into compile errors (rank, dtype, operand kinds), one function
// each, compiled with -fsyntax-only by run.cmake (ctest entry compile_fail), which
// expects each message below to appear in the compiler's output. With
// -DKILN_COMPILE_FAIL_CONTROL only the valid twins compile: that build must succeed,
// so a broken harness cannot pass. Not part of kiln_tests.
// Each case is `// expect: <text of the static_assert>` above its function.
#include "kiln/kiln.hpp"

using namespace kiln;

#ifndef KILN_COMPILE_FAIL_CONTROL
// expect: operands have different dtypes
void dtype_mismatch(Tensor<f32, 2> x, Tensor<f64, 2> y) { Tensor<f32, 2> z = x + y; }
// expect: this op needs a floating-point operand
void float_op_on_int(Tensor<i32, 2> x) { Tensor<i32, 2> z = kiln::exp(x); }
// expect: assigning an expression to a Tensor of another rank
void wrong_rank(Tensor<f32, 2> x) { Tensor<f32, 1> z = x + 1; }
// expect: assigning an expression to a Tensor of another dtype
void wrong_dtype(Tensor<f32, 2> x) { Tensor<f64, 2> z = x + 1; }
// expect: arithmetic on boolean tensors
void bool_arithmetic(Tensor<boolean, 2> b) { Tensor<boolean, 2> z = b + b; }
// expect: operands need rank >= 2
void matmul_vector(Tensor<f32, 1> v, Tensor<f32, 2> m) { (void)kiln::matmul(v, m); }
// expect: reductions need a numeric dtype
void reduce_bool(Tensor<boolean, 2> b) { (void)kiln::sum(b); }
// expect: the condition must be a boolean expression
void where_numeric(Tensor<f32, 2> x) { (void)kiln::where(x, x, x); }
// expect: concat: all operands need the same dtype and rank
void concat_mixed(Tensor<f32, 2> x, Tensor<f32, 1> v) { (void)kiln::concat(0, x, v); }
// expect: rank must be between 0 and kiln::kMaxRank
void rank_nine() { Tensor<f32, 9> t; }
#else
void dtype_mismatch(Tensor<f32, 2> x, Tensor<f64, 2> y) { Tensor<f32, 2> z = x + kiln::cast<f32>(y); }
void float_op_on_int(Tensor<i32, 2> x) { Tensor<f32, 2> z = kiln::exp(kiln::cast<f32>(x)); }
void wrong_rank(Tensor<f32, 2> x) { Tensor<f32, 2> z = x + 1; }
void wrong_dtype(Tensor<f32, 2> x) { Tensor<f64, 2> z = kiln::cast<f64>(x) + 1; }
void bool_arithmetic(Tensor<boolean, 2> b) { Tensor<boolean, 2> z = kiln::maximum(b, b); }
void matmul_vector(Tensor<f32, 1> v, Tensor<f32, 2> m) { (void)kiln::matmul(kiln::unsqueeze(v, 0), m); }
void reduce_bool(Tensor<boolean, 2> b) { (void)kiln::sum(kiln::cast<i32>(b)); }
void where_numeric(Tensor<f32, 2> x) { (void)kiln::where(x > 0, x, x); }
void concat_mixed(Tensor<f32, 2> x, Tensor<f32, 1> v) { (void)kiln::concat(0, x, kiln::unsqueeze(v, 0)); }
void rank_nine() { Tensor<f32, 8> t; }
#endif

int main() {}
