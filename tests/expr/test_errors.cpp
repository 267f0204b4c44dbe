// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Nothing silent: a shape mismatch throws kiln::ShapeError naming the op and both
// shapes, as the expression is built (before anything runs); bad axes, sizes, views
// and indices throw naming what is wrong; one expression over two devices throws
// naming both; an undefined tensor throws. Rank and dtype mistakes are compile errors:
// tests/compile_fail/ checks their messages (ctest entry compile_fail).
#include <functional>

#include "../support/reference.hpp"
#include "../support/rows.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Runs f, which must throw E with every one of `parts` in its message.
template <class E = ShapeError>
void check_throws(const std::function<void()>& f, std::initializer_list<std::string> parts, const std::string& what) {
  INFO(what);
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    std::string msg = e.what();
    for (const std::string& p : parts) {
      INFO("message: ", msg);
      CHECK_MESSAGE(msg.find(p) != std::string::npos, "the message should name '" << p << "'");
    }
  } catch (const std::exception& e) {
    FAIL_CHECK("threw another exception: " << e.what());
    return;
  }
  CHECK_MESSAGE(thrown, "nothing was thrown");
}

}  // namespace

TEST_CASE("a shape mismatch in every binary row throws ShapeError naming the op and both shapes") {
  auto x = Tensor<f32, 2>::empty({3, 4}, cpu()), y = Tensor<f32, 2>::empty({5, 4}, cpu());
  Counters before = counters();
  for_each_row([&](auto row) {
    constexpr Prim P = decltype(row)::value;
    if constexpr (prim_info(P).kind == PrimKind::binary) {
      std::string op(prim_info(P).name);
      check_throws([&] { (void)apply_binary<P>(x, y); }, {op, "[3, 4]", "[5, 4]"}, op + " of [3, 4] and [5, 4]");
      check_throws([&] { (void)apply_binary<P>(kiln::exp(x), y); }, {op, "[3, 4]", "[5, 4]"}, op + " of expressions");
    }
  });
  // thrown as the expression is built: nothing ran
  CHECK(counters().kernels_launched == before.kernels_launched);
}

TEST_CASE("shape errors of the other ops name the op and the shapes") {
  auto x = Tensor<f32, 2>::empty({3, 4}, cpu()), y = Tensor<f32, 2>::empty({5, 6}, cpu());
  auto c = Tensor<boolean, 2>::empty({2, 4}, cpu());
  auto e = Tensor<f32, 3>::empty({4, 0, 6}, cpu());
  check_throws([&] { (void)kiln::where(c, x, x); }, {"where", "[2, 4]", "[3, 4]"}, "where");
  check_throws([&] { (void)kiln::matmul(x, y); }, {"matmul", "[3, 4]", "[5, 6]"}, "matmul inner dims");
  check_throws([&] { (void)kiln::matmul(Tensor<f32, 3>::empty({2, 3, 4}, cpu()), Tensor<f32, 3>::empty({3, 4, 5}, cpu())); },
               {"matmul", "[2]", "[3]"}, "matmul batch dims");
  check_throws([&] { (void)kiln::concat(0, x, y); }, {"concat", "[3, 4]", "[5, 6]"}, "concat");
  check_throws([&] { (void)kiln::reshape(x, Shape<2>{5, 5}); }, {"reshape", "[3, 4]", "[5, 5]"}, "reshape");
  check_throws([&] { (void)kiln::reshape(x, Shape<2>{-1, -1}); }, {"reshape", "-1"}, "reshape with two -1");
  check_throws([&] { (void)kiln::expand(x, std::array<int64_t, 2>{6, 4}); }, {"expand", "[3, 4]", "[6, 4]"}, "expand");
  check_throws([&] { (void)x.expand({6, 4}); }, {"expand", "[3, 4]", "[6, 4]"}, "Tensor::expand");
  check_throws([&] { (void)kiln::sum(x, 2); }, {"sum", "axis 2", "rank 2"}, "sum over a missing axis");
  check_throws([&] { (void)kiln::amax(x, std::array{1, -1}); }, {"amax", "axis -1", "repeated"}, "amax over an axis twice");
  check_throws([&] { (void)kiln::amax(e, 1); }, {"amax", "empty axis", "[4, 0, 6]"}, "amax over an empty axis");
  check_throws([&] { (void)kiln::amin(e); }, {"amin", "[4, 0, 6]"}, "amin of an empty tensor");
  check_throws([&] { (void)kiln::slice(kiln::exp(x), 1, 0, 4, 0); }, {"slice", "step"}, "slice with step 0");
  check_throws([&] { (void)kiln::pad(x, {0, -1}, {0, 0}); }, {"pad", "negative"}, "pad by a negative amount");
  check_throws([&] { (void)kiln::permute(kiln::exp(x), {1, 1}); }, {"permute", "repeated"}, "permute repeating an axis");
  check_throws([&] { (void)kiln::transpose(x, 0, 2); }, {"transpose", "axis 2"}, "transpose of a missing axis");
  check_throws([&] { (void)kiln::softmax(x, 3); }, {"axis 3"}, "softmax over a missing axis");
}

TEST_CASE("tensor construction and access errors") {
  check_throws([] { (void)Tensor<f32, 2>::from({2, 3}, std::vector<double>(5)); }, {"from", "5 values", "[2, 3]"}, "from");
  check_throws([] { (void)Tensor<f32, 2>::empty({2, -3}, cpu()); }, {"empty", "[2, -3]"}, "empty with a negative size");
  auto x = Tensor<f32, 2>::from({2, 3}, std::vector<double>(6, 1.0));
  check_throws([&] { (void)x.transpose(0, 1).view<1>({6}); }, {"view", "not contiguous"}, "view of non-contiguous memory");
  check_throws([&] { (void)x.view<2>({4, 2}); }, {"view", "[2, 3]", "[4, 2]"}, "view to another size");
  check_throws([&] { (void)x(2, 0); }, {"index", "[2, 0]", "[2, 3]"}, "an index out of range");
  check_throws<Error>([&] { (void)kiln::dropout(x, 1.0, 1); }, {"dropout", "p"}, "dropout with p = 1");
}

TEST_CASE("an undefined tensor in an expression throws") {
  Tensor<f32, 2> undefined;
  check_throws<Error>([&] { Tensor<f32, 2> y = kiln::exp(undefined); }, {"undefined"}, "exp(an undefined tensor)");
}

TEST_CASE("one expression over two devices throws naming both") {
  // A stand-in second device: the hip slot backed by host memory, for this test only.
  MemoryHooks& hooks = detail::memory_hooks(DeviceKind::hip);
  const MemoryHooks saved = hooks;
  hooks = detail::memory_hooks(DeviceKind::cpu);
  {
    auto on_cpu = Tensor<f32, 2>::from({2, 3}, std::vector<double>(6, 1.0), cpu());
    auto on_other = Tensor<f32, 2>::empty({2, 3}, kiln::hip(0));
    check_throws<Error>([&] { Tensor<f32, 2> y = on_cpu + on_other; }, {"mixes", "cpu", "hip:0"}, "cpu + hip:0");
    check_throws<Error>([&] { Tensor<f32, 2> y = kiln::exp(on_other) * on_cpu; }, {"mixes", "cpu", "hip:0"},
                        "exp(hip:0) * cpu");
  }
  hooks = saved;
}
