// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The order in which a persistent GEMM block (codegen/gemm_sm90.hpp) takes its work: pasted
// into programs that hold such a kernel, and compiled on the host by the runtime (to size the
// workspace) and by the tests that check the schedule. Plain C++ (KILN_FN: the dialect's, or
// the host's, function qualifier). In a cluster the unit of the walk is the cluster: `tiles`,
// `grid` and `block` count clusters, and every block of one takes the same units.
//
// Units of work: a tile and its K steps [kb, ke). Whole tiles go round the blocks (tile
// `block`, + `grid`, ...). Split tail (GemmConfig::split_tail): where the tiles leave the last
// wave partial, those `tail` tiles are cut in K into `parts` pieces each (kiln_tail_parts), and
// after the whole tiles the pieces go round the blocks: piece 0 of every tail tile, then
// piece 1, ... So the blocks that run at the same time read the same K range, and the A and B
// panels their tiles share meet in L2. (Stream-K's runs across tiles, one a block, each at its
// own K offset, read their panels alone: on an H200 W4's GEMMs with K = 16384 ran 27% slower
// so; docs/benchmarks.md, fourteenth session.) A piece that ends before K leaves its sums in
// the workspace, at the slot of its unit (kiln_split_give); the last piece finishes the tile:
// it adds the others' sums, in piece order, and stores (kiln_split_take). Only for one batch
// (`batches` == 1).

// Pieces a tail tile is cut into: the count, of 1 .. 8 and at most a piece a K step, that
// finishes the tail soonest, counted in K steps: its rounds of pieces on the blocks, plus about
// `handover` K steps for each piece's sums handed over (a 128x256 tile's 128 KB of floats
// written by one SM and read by another); 1 where no cut gains. NOTE: the hand-over's cost is
// an estimate, not a measurement.
KILN_FN int kiln_tail_parts(int64_t tail, int64_t grid, int kt) {
  const int most = 8, handover = 2;
  int best = 1;
  int64_t best_steps = kt;
  for (int s = 2; s <= most && s <= kt && tail > 0; ++s) {
    const int64_t rounds = (tail * s + grid - 1) / grid, steps = rounds * ((kt + s - 1) / s) + handover * s;
    if (steps < best_steps) best = s, best_steps = steps;
  }
  return best;
}

struct KilnWalk {
  // `next`: the block's next whole tile, past `whole` its next unit + whole.
  int64_t grid, whole, next;
  int tail, kt, parts;
  // `parts_wanted`: the pieces a tail tile is cut into, at most one a K step (0: kiln_tail_parts's choice).
  KILN_FN KilnWalk(int64_t tiles, int KT, int64_t grid_, int64_t block, int64_t batches, bool split_tail, int parts_wanted = 0)
      : grid(grid_), next(block), kt(KT) {
    tail = split_tail && batches == 1 && tiles > grid ? (int)(tiles % grid) : 0;
    parts = tail == 0 ? 1 : parts_wanted <= 0 ? kiln_tail_parts(tail, grid, KT) : parts_wanted < KT ? parts_wanted : KT;
    if (parts <= 1) parts = 1, tail = 0;
    whole = tiles - tail;
  }
  // The tail's units (pieces): unit u is piece u / tail of tile whole + u % tail, its K steps
  // [begin(piece), begin(piece + 1)). A block's units are block, + grid, ... (whole is a
  // multiple of grid), so the blocks of one round take the same piece of different tiles.
  KILN_FN int64_t units() const { return (int64_t)tail * parts; }
  KILN_FN int64_t unit_tile(int64_t u) const { return whole + u % tail; }
  KILN_FN int unit_piece(int64_t u) const { return (int)(u / tail); }
  KILN_FN int begin(int piece) const { return (int)((int64_t)piece * kt / parts); }
  // The next unit into (tile, kb, ke), whole tiles first; false once the block has done its share.
  KILN_FN bool step(int64_t& tile, int& kb, int& ke) {
    if (next < whole) {
      tile = next, kb = 0, ke = kt, next += grid;
      return true;
    }
    const int64_t u = next - whole;
    if (u >= units()) return false;
    tile = unit_tile(u), kb = begin(unit_piece(u)), ke = begin(unit_piece(u) + 1), next += grid;
    return true;
  }
  // A piece's workspace slot (where it ends before K) is its unit; the tail's tiles count the
  // pieces handed in at their place in the tail (tile - whole). The slots the tail needs in all
  // (a tile of floats each, per block of a cluster).
  KILN_FN int64_t slots() const { return (int64_t)tail * (parts - 1); }
};
