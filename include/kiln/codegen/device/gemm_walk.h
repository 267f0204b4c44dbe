// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The order in which a persistent GEMM block (codegen/gemm_sm90.hpp) takes its work: pasted
// into programs that hold such a kernel, and compiled on the host by the tests that check
// the schedule. Plain C++ (KILN_FN: the dialect's, or the test's, function qualifier).
//
// Units of work: a tile and its K steps [kb, ke). Whole tiles go round the blocks (tile
// `block`, + `grid`, ...). Stream-K (GemmConfig::stream_k): where the tiles leave the last
// wave partial, the first `sk` tiles (that wave's and one full wave's worth) are laid end to
// end, K step after K step, and cut into one equal run a block, before the rest go round
// whole. Each run is at least a tile's K steps long, so a tile is cut at most once: the block
// whose run ends in it begins it (kb = 0, ke < KT: it adds the rest, kiln_sk_take), and the
// next block ends it (kb > 0: kiln_sk_give), first thing in its run, so the wait is short.
// Only for one batch (`batches` == 1): the workspace holds one tile per block.
struct KilnWalk {
  int64_t tiles, pos, end, next, grid;
  int kt;
  KILN_FN KilnWalk(int64_t tiles_, int KT, int64_t grid_, int64_t block, int64_t batches, bool stream_k)
      : tiles(tiles_), grid(grid_), kt(KT) {
    const int64_t sk = stream_k && batches == 1 && KT > 0 && tiles > grid && tiles % grid ? tiles % grid + grid : 0;
    pos = block * sk * KT / grid, end = (block + 1) * sk * KT / grid, next = sk + block;
  }
  // The next unit into (tile, kb, ke); false once the block has done its share.
  KILN_FN bool step(int64_t& tile, int& kb, int& ke) {
    if (pos < end) {
      tile = pos / kt, kb = (int)(pos - tile * kt);
      ke = end - tile * kt < kt ? (int)(end - tile * kt) : kt;
      pos = tile * kt + ke;
      return true;
    }
    if (next >= tiles) return false;
    tile = next, kb = 0, ke = kt, next += grid;
    return true;
  }
};
