#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_LAUNCH_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_LAUNCH_HPP

// Launch of a tensor-core team kernel with more team scratch than Kokkos'
// CUDA TeamPolicy grants. Kokkos checks level-0 scratch against the 48 KB
// static shared-memory limit (about 40 KB once its own reserve is taken),
// while sm_80+ blocks may opt in to far more (227 KB on Hopper), which the
// FlashAttention-2 tile shapes need: a 128-row Q block and double-buffered
// K and V blocks are ~100 KB at head_dim 128.
//
// The functor is the one the TeamPolicy path runs: its body is a template on
// the team handle, Kokkos' team member there and CudaTeam here (same block
// shape: 32 lanes in x, the team's warps in y). The launch is enqueued on the
// execution space instance's stream, reported to Kokkos Tools as a
// parallel_for under the kernel's label, and every CUDA error is turned into
// an exception.

#include <Kokkos_Core.hpp>

#include <kfa/detail/common/team_launch.hpp>
#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kfa {
namespace Impl {

/// Teams per group of (batch, head) pairs in the leagues of the fused CUDA
/// kernels (FusedProblem::block_of) unless the call's KernelPolicy says
/// otherwise.
constexpr int kDefaultLeagueGroupTeams = 256;

/// The mask of a fused call: AttentionOptions' window_left and window_right
/// (-1 unbounded), causal being (-1, 0), and for a packed variable-length
/// batch its sequences (cu_seqlens on the device; a sequence sees only its
/// own keys, the window taken in its own rows). A kernel visits only the
/// key blocks (forward) or query blocks (backward) inside the window and
/// tests single scores only in the tiles the window's edges cut.
struct FusedWindow {
  int left = -1, right = -1;
  /// Packed batches: offsets [sequences + 1] of each sequence's first q and
  /// k row in the views [1][total][heads][head_dim]; null otherwise. The
  /// longest lengths size the leagues.
  const int* cu_q = nullptr;
  const int* cu_k = nullptr;
  int sequences = 0, max_seqlen_q = 0, max_seqlen_k = 0;

  FusedWindow(bool causal) : right(causal ? 0 : -1) {}
  FusedWindow(int window_left, int window_right) : left(window_left), right(window_right) {}
  bool causal() const { return left < 0 && right == 0; }
  bool packed() const { return cu_q != nullptr; }
};

/// One sequence as a tile sees it: where its rows start in the views
/// (batch entry view_b, rows q_begin and k_begin on), its lengths, and its
/// mask. The kernels work in the sequence's own row and key indices.
struct FusedSeq {
  int view_b, q_begin, k_begin;
  int seqlen_q, seqlen_k;
  AttentionMask mask;
};

/// What every fused CUDA kernel knows of its problem: q [batch][seqlen_q]
/// [heads][head_dim], k and v [batch][seqlen_k][heads][head_dim], lse
/// [batch][heads][seqlen_q], and the mask (FusedWindow), or for a packed
/// batch the views [1][total] and the sequences in them; each sequence's
/// rows and offsets in those tensors (FusedSeq); and which (sequence,
/// head, block) a team of a league that runs the blocks of every (sequence,
/// head) owns. (k and v with fewer heads: FusedKvHeads.)
struct FusedProblem {
  /// Sequences, and their (longest) lengths.
  int batch, seqlen_q, heads, seqlen_k;
  AttentionMask mask;  // of the fixed-length sequences
  int group_teams = kDefaultLeagueGroupTeams;  // 0: one group of every pair
  /// The views' batch and rows (those above, unless packed).
  int view_batch, rows_q, rows_k;
  const int* cu_q;
  const int* cu_k;

  template <class Q, class K>
  FusedProblem(const Q& q, const K& k, FusedWindow window)
      : batch(window.packed() ? window.sequences : static_cast<int>(q.extent(0))),
        seqlen_q(window.packed() ? window.max_seqlen_q : static_cast<int>(q.extent(1))),
        heads(static_cast<int>(q.extent(2))),
        seqlen_k(window.packed() ? window.max_seqlen_k : static_cast<int>(k.extent(1))),
        mask(seqlen_q, seqlen_k, window.left, window.right),
        view_batch(static_cast<int>(q.extent(0))),
        rows_q(static_cast<int>(q.extent(1))),
        rows_k(static_cast<int>(k.extent(1))),
        cu_q(window.cu_q),
        cu_k(window.cu_k) {}

  bool packed() const { return cu_q != nullptr; }

  /// Sequence b: in a packed batch its rows of the views and its own mask
  /// (the window's bounds, kept in `mask`, aligned to its own lengths).
  KOKKOS_INLINE_FUNCTION FusedSeq sequence(int b) const {
    if (cu_q == nullptr) return {b, 0, 0, seqlen_q, seqlen_k, mask};
    const int q0 = cu_q[b], k0 = cu_k[b];
    const int lq = cu_q[b + 1] - q0, lk = cu_k[b + 1] - k0;
    return {0, q0, k0, lq, lk, AttentionMask(lq, lk, mask.m_left, mask.m_right)};
  }

  /// Teams of a league of `blocks` blocks per (batch, head).
  int league(int blocks) const { return blocks * batch * heads; }
  /// Fewest blocks per (batch, head) for which block_of groups the pairs.
  static constexpr int kMinGroupedBlocks = 8;
  /// Team `league_rank`'s batch, head and block, of `blocks` per (batch,
  /// head). With kMinGroupedBlocks blocks or more, the (batch, head) pairs
  /// go in groups of about group_teams / blocks; within a group, blocks of
  /// one index run side by side over its pairs, block 0 first (the longest
  /// under the causal mask, in the backward; the forward reverses the
  /// index), and groups run one after the other. So the teams that run at
  /// once share a few heads, whose K and V (forward) or Q, dO and dQ rows
  /// (backward) stay in L2 between them, instead of each team of a wave
  /// streaming its own head from memory. With fewer blocks the pairs of a
  /// wave fit L2 in any order, and one group of every pair keeps the
  /// causal teams longest first over the whole league.
  KOKKOS_INLINE_FUNCTION int block_of(int league_rank, int blocks, int& b, int& h) const {
    const int pairs = batch * heads;
    const int group_pairs = group_teams > 0 && blocks >= kMinGroupedBlocks
                                ? imax(1, imin(pairs, group_teams / blocks))
                                : pairs;
    const int group = league_rank / (group_pairs * blocks);
    const int first_pair = group * group_pairs;
    const int in_group = imin(group_pairs, pairs - first_pair);
    const int r = league_rank - first_pair * blocks;
    const int bh = first_pair + r % in_group;
    b = bh / heads;
    h = bh % heads;
    return r / in_group;
  }
  /// Offset of (sequence s's row 0, h, 0) in q, o or dO [view_batch]
  /// [rows_q][heads][head_dim].
  KOKKOS_INLINE_FUNCTION long q_offset(const FusedSeq& s, int h, int head_dim) const {
    return ((long(s.view_b) * rows_q + s.q_begin) * heads + h) * head_dim;
  }
  /// The same in k or v with as many heads as q.
  KOKKOS_INLINE_FUNCTION long k_offset(const FusedSeq& s, int h, int head_dim) const {
    return ((long(s.view_b) * rows_k + s.k_begin) * heads + h) * head_dim;
  }
  /// Offset of (sequence s's row 0, h) in lse (or D) [view_batch][heads]
  /// [rows_q].
  KOKKOS_INLINE_FUNCTION long lse_offset(const FusedSeq& s, int h) const {
    return (long(s.view_b) * heads + h) * rows_q + s.q_begin;
  }
};

/// Grouped-query heads of the fused kernels: k and v [batch][seqlen_k]
/// [heads_kv][head_dim], query head h reading k/v head h / group.
struct FusedKvHeads {
  int heads_kv, group;
  // h / group as (umulhi(h, magic) + h) >> shift (Granlund and Montgomery's
  // round-up method, exact for 0 <= h < 2^31): no integer division in the
  // kernels, whose address arithmetic then stays on the uniform datapath.
  unsigned magic, shift;

  template <class Q, class K>
  FusedKvHeads(const Q& q, const K& k)
      : heads_kv(static_cast<int>(k.extent(2))),
        group(heads_kv > 0 && q.extent(2) > 0 ? static_cast<int>(q.extent(2)) / heads_kv : 1),
        magic(0),
        shift(0) {
    while ((1u << shift) < unsigned(group)) ++shift;
    magic = static_cast<unsigned>(
        ((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift) - group)) / group + 1);
  }
  /// The k/v head of query head h.
  KOKKOS_INLINE_FUNCTION int head(int h) const {
    const unsigned hi = static_cast<unsigned>((std::uint64_t(unsigned(h)) * magic) >> 32);
    return static_cast<int>((hi + unsigned(h)) >> shift);
  }
  /// Offset of (sequence s's row 0, the k/v head of query head h, 0) in k
  /// or v.
  KOKKOS_INLINE_FUNCTION long offset(const FusedProblem& p, const FusedSeq& s, int h,
                                     int head_dim) const {
    return ((long(s.view_b) * p.rows_k + s.k_begin) * heads_kv + head(h)) * head_dim;
  }
  /// Elements between consecutive rows of k or v.
  KOKKOS_INLINE_FUNCTION long row_stride(int head_dim) const { return long(heads_kv) * head_dim; }
};

/// A fused kernel's variant (kfa/detail/attention/variant.hpp) at run time:
/// the score pipeline (softcap, score modifier, dropout) that its kernels
/// apply to the score fragments in registers, in the accumulator type Acc
/// (float for the 16-bit kernels), and the softmax scale in natural units,
/// which the pipeline takes before the exponent. Empty for the plain
/// variant, whose kernels fold the scale into the exponent.
template <class VariantT, class Acc = float, bool = VariantT::kModifiers || VariantT::kScoreMod>
struct FusedVariantParams {
  static constexpr bool kVariant = false;

  KOKKOS_FORCEINLINE_FUNCTION void trim_key_blocks(const AttentionMask&, int, int, int, int, int,
                                                   int&, int&) const {}
  KOKKOS_FORCEINLINE_FUNCTION void trim_query_blocks(const AttentionMask&, int, int, int, int,
                                                     int, int&, int&) const {}
};
template <class VariantT, class Acc>
struct FusedVariantParams<VariantT, Acc, true> {
  static constexpr bool kVariant = true;
  ScorePipeline<VariantT, Acc> m_pipe;
  Acc m_variant_scale;

  template <class MemorySpace>
  FusedVariantParams(const KernelParams<Acc, MemorySpace>& params,
                     const typename VariantT::score_mod_type& mod)
      : m_pipe(params, mod), m_variant_scale(params.scale) {}

  /// Sequence b's lengths as the pipeline's modifiers see them (`mask` is
  /// the sequence's own).
  KOKKOS_FORCEINLINE_FUNCTION static SequenceInfo sequence(const AttentionMask& mask, int b) {
    return {b, 0, mask.m_seqlen_q, 0, mask.m_seqlen_k};
  }

  /// Narrows the key blocks [first, end) of rows [row_begin, row_end) to the
  /// first and last ones the modifier's block predicate lets through, so
  /// that loads and loops skip the hidden blocks at both ends (all but a
  /// document's own under a document mask); hidden blocks between stay and
  /// score -inf.
  KOKKOS_FORCEINLINE_FUNCTION void trim_key_blocks(const AttentionMask& mask, int b, int h,
                                                   int row_begin, int row_end, int block_n,
                                                   int& first, int& end) const {
    if constexpr (score_mod_has_visible<typename VariantT::score_mod_type>::value) {
      auto shown = [&](int lo, int hi) {
        return m_pipe.visible(b, h, row_begin, row_end, lo * block_n,
                              imin(hi * block_n, mask.m_seqlen_k));
      };
      trim_hidden_blocks(shown, first, end);
    }
  }

  /// The same for the query blocks [first, end) of keys [key_begin, key_end).
  KOKKOS_FORCEINLINE_FUNCTION void trim_query_blocks(const AttentionMask& mask, int b, int h,
                                                     int key_begin, int key_end, int block_m,
                                                     int& first, int& end) const {
    if constexpr (score_mod_has_visible<typename VariantT::score_mod_type>::value) {
      auto shown = [&](int lo, int hi) {
        return m_pipe.visible(b, h, lo * block_m, imin(hi * block_m, mask.m_seqlen_q), key_begin,
                              key_end);
      };
      trim_hidden_blocks(shown, first, end);
    }
  }

};

/// What every tile shape of a fused kernel names: warps per team and
/// pipeline stages.
template <int Warps, int Stages>
struct FusedTeamShape {
  static constexpr int kWarps = Warps;
  static constexpr int kStages = Stages;
};

/// Tile shape of a tensor-core forward (mma.sync 16-bit, fp32/fp64):
/// warps per team, m-tiles (one atom of query rows each) per warp, keys per
/// K/V block, pipeline stages (1: TeamPolicy launch, Q in registers; 2:
/// opt-in shared memory, Q in scratch, K/V double buffered), and the launch
/// bound (teams per multiprocessor, which caps the registers per thread).
/// kRescaleOAlways (fp32/fp64 only): with fp64's lazy rescale, O multiplied
/// by the factor in every block (true; a shape derived from this one, for
/// the bench) or only in blocks where the running max moved.
template <int Warps, int MTiles, int BlockN, int Stages, int MinBlocksPerSM>
struct FusedFwdShape : FusedTeamShape<Warps, Stages> {
  static constexpr int kMTiles = MTiles;
  static constexpr int kBlockN = BlockN;
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  static constexpr bool kRescaleOAlways = false;
};

/// A forward team's tile: query rows [row_begin, row_begin + kBlockM) of
/// sequence b (sq) and head h.
struct FusedQueryTile {
  int b, h, row_begin;
  FusedSeq sq;

  /// No rows: a packed batch's shorter sequences have fewer blocks than the
  /// league.
  KOKKOS_INLINE_FUNCTION bool empty() const { return row_begin >= sq.seqlen_q; }

  /// The key blocks [first, end) of block_n keys that the tile's first
  /// `rows` rows see: those inside the mask's window
  /// (AttentionMask::key_blocks), narrowed by the variant's block predicate.
  template <class Variant>
  KOKKOS_INLINE_FUNCTION void key_blocks(int rows, int block_n, int& first, int& end,
                                         const Variant& variant) const {
    sq.mask.key_blocks(row_begin, row_begin + rows, block_n, first, end);
    variant.trim_key_blocks(sq.mask, b, h, row_begin, row_begin + rows, block_n, first, end);
  }
};

/// A backward team's tile: keys [key_begin, key_begin + block_n) of
/// sequence b (sq) and head h, and the offsets of its rows in q, dO, dQ
/// (q_offset) and in dK, dV (k_offset), rows row_stride apart.
struct FusedKeyTile {
  int b, h, key_begin;
  FusedSeq sq;
  long row_stride, q_offset, k_offset;

  /// No keys: a packed batch's shorter sequences have fewer blocks than the
  /// league.
  KOKKOS_INLINE_FUNCTION bool empty() const { return key_begin >= sq.seqlen_k; }

  /// The query blocks [first, end) of block_m rows that see the tile's
  /// block_n keys under the mask.
  KOKKOS_INLINE_FUNCTION void query_blocks(int block_n, int block_m, int& first, int& end) const {
    first = sq.mask.row_begin(key_begin) / block_m;
    end = (sq.mask.row_end(key_begin + block_n) + block_m - 1) / block_m;
  }
  /// The same, narrowed by the variant's block predicate.
  template <class Variant>
  KOKKOS_INLINE_FUNCTION void query_blocks(int block_n, int block_m, int& first, int& end,
                                           const Variant& variant) const {
    query_blocks(block_n, block_m, first, end);
    variant.trim_query_blocks(sq.mask, b, h, key_begin, imin(key_begin + block_n, sq.seqlen_k),
                              block_m, first, end);
  }
};

/// The operands of a fused forward: q, k, v and o (elements T: fp32, fp64,
/// or raw 16-bit values), lse and the scale in the accumulator type Acc, the
/// problem, and the query blocks per (sequence, head) that size the league.
/// The base of every fused CUDA forward kernel.
template <class T, class Acc = T>
struct FusedForwardOperands {
  const T* m_q;
  const T* m_k;
  const T* m_v;
  T* m_o;
  Acc* m_lse;
  Acc m_scale;  // as the kernel's softmax takes it (in base 2 where it runs in base 2)
  FusedProblem m_p;
  FusedKvHeads m_kv;
  int m_num_q_blocks;

  /// Teams per group of (batch, head) pairs in the league (FusedProblem).
  void set_league_group_teams(int teams) { m_p.group_teams = teams; }

  template <class Q, class K, class V, class O, class Lse>
  FusedForwardOperands(const Q& q, const K& k, const V& v, const O& o, const Lse& lse, Acc scale,
                       FusedWindow window, int block_m)
      : m_q(reinterpret_cast<const T*>(q.data())),
        m_k(reinterpret_cast<const T*>(k.data())),
        m_v(reinterpret_cast<const T*>(v.data())),
        m_o(reinterpret_cast<T*>(o.data())),
        m_lse(lse.data()),
        m_scale(scale),
        m_p(q, k, window),
        m_kv(q, k),
        m_num_q_blocks((m_p.seqlen_q + block_m - 1) / block_m) {}

  /// Teams of the kernel's league.
  int league_size() const { return m_p.league(m_num_q_blocks); }

  /// Team league_rank's tile. The query blocks run in reverse (block_of):
  /// under a causal mask the last ones see the most keys, so they start
  /// first and the short ones fill the tail.
  KOKKOS_INLINE_FUNCTION FusedQueryTile query_tile(int league_rank, int block_m) const {
    int b, h;
    const int q_block = m_num_q_blocks - 1 - m_p.block_of(league_rank, m_num_q_blocks, b, h);
    return {b, h, q_block * block_m, m_p.sequence(b)};
  }
};

/// The operands of a fused backward: q, k, v, dO (elements T), lse, D, the
/// dQ accumulator (zeroed by the caller) and the scale in the accumulator
/// type Acc, dK and dV, the problem, and the key blocks per (sequence, head)
/// that size the league. The base of every fused CUDA backward kernel.
template <class T, class Acc = T>
struct FusedBackwardOperands {
  const T* m_q;
  const T* m_k;
  const T* m_v;
  const T* m_do;
  const Acc* m_lse;
  const Acc* m_delta;
  Acc* m_dq;
  T* m_dk;
  T* m_dv;
  Acc m_scale;
  FusedProblem m_p;
  FusedKvHeads m_kv;
  int m_num_kv_blocks;

  /// Teams per group of (batch, head) pairs in the league (FusedProblem).
  void set_league_group_teams(int teams) { m_p.group_teams = teams; }
  /// Grouped-query heads: dK and dV to Acc buffers of every query head,
  /// [batch][seqlen_k][heads][head_dim] each, in place of dk and dv (the
  /// caller sums them per k/v head; the 16-bit kernels tell them apart by
  /// m_kv.group, Fused16Backward::store_dk_dv).
  void write_grouped(Acc* dk, Acc* dv) {
    m_dk = reinterpret_cast<T*>(dk);
    m_dv = reinterpret_cast<T*>(dv);
  }

  template <class Q, class K, class V, class DO, class Lse, class Delta, class DQ, class DK,
            class DV>
  FusedBackwardOperands(const Q& q, const K& k, const V& v, const DO& d_o, const Lse& lse,
                        const Delta& delta, const DQ& dq, const DK& dk, const DV& dv, Acc scale,
                        FusedWindow window, int block_n)
      : m_q(reinterpret_cast<const T*>(q.data())),
        m_k(reinterpret_cast<const T*>(k.data())),
        m_v(reinterpret_cast<const T*>(v.data())),
        m_do(reinterpret_cast<const T*>(d_o.data())),
        m_lse(lse.data()),
        m_delta(delta.data()),
        m_dq(dq.data()),
        m_dk(reinterpret_cast<T*>(dk.data())),
        m_dv(reinterpret_cast<T*>(dv.data())),
        m_scale(scale),
        m_p(q, k, window),
        m_kv(q, k),
        m_num_kv_blocks((m_p.seqlen_k + block_n - 1) / block_n) {}

  /// Teams of the kernel's league.
  int league_size() const { return m_p.league(m_num_kv_blocks); }

  /// Team league_rank's tile (block_of), of block_n keys.
  KOKKOS_INLINE_FUNCTION FusedKeyTile key_tile(int league_rank, int block_n, int head_dim) const {
    int b, h;
    const int kv_block = m_p.block_of(league_rank, m_num_kv_blocks, b, h);
    const FusedSeq sq = m_p.sequence(b);
    return {b, h, kv_block * block_n, sq, long(m_p.heads) * head_dim,
            m_p.q_offset(sq, h, head_dim), m_p.k_offset(sq, h, head_dim)};
  }
};

/// The base of the mma.sync and the wgmma forward kernels: 16-bit operands,
/// fp32 lse, the scale in base 2.
struct Fused16Forward : FusedForwardOperands<std::uint16_t, float> {
  template <class Q, class K, class V, class O, class Lse>
  Fused16Forward(const Q& q, const K& k, const V& v, const O& o, const Lse& lse, float scale,
                 FusedWindow window, int block_m)
      : FusedForwardOperands(q, k, v, o, lse, scale * 1.4426950408889634f, window, block_m) {}
};

/// The base of the mma.sync and the wgmma backward kernels: 16-bit operands
/// and dK, dV (fp32 with grouped-query heads), fp32 lse, D and dQ
/// accumulator.
struct Fused16Backward : FusedBackwardOperands<std::uint16_t, float> {
  using FusedBackwardOperands::FusedBackwardOperands;

  /// Two adjacent values at offset `at` of dst (m_dk or m_dv), a [batch]
  /// [seqlen_k][heads][head_dim] tensor: fp32 per query head with
  /// grouped-query heads (write_grouped), else 16-bit.
  template <class Format>
  KOKKOS_FORCEINLINE_FUNCTION void store_pair(std::uint16_t* dst, long at, float x0,
                                              float x1) const {
#if KFA_CUDA_MMA_DEVICE
    if (m_kv.group > 1)
      *reinterpret_cast<float2*>(reinterpret_cast<float*>(dst) + at) = make_float2(x0, x1);
    else
      *reinterpret_cast<std::uint32_t*>(dst + at) = cuda_mma::pack2<Format>(x0, x1);
#else
    (void)dst, (void)at, (void)x0, (void)x1;
#endif
  }
  /// A lane's two adjacent dK and two dV values at offset `at`.
  template <class Format>
  KOKKOS_FORCEINLINE_FUNCTION void store_dk_dv(long at, float dk0, float dk1, float dv0,
                                               float dv1) const {
    store_pair<Format>(m_dk, at, dk0, dk1);
    store_pair<Format>(m_dv, at, dv0, dv1);
  }
};

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)

/// The team handle of a kernel launched by launch_cuda_team: one team per
/// block, the league along blockIdx.x.
struct CudaTeam {
  __device__ int league_rank() const { return static_cast<int>(blockIdx.x); }
  __device__ void team_barrier() const { __syncthreads(); }
};

// static, as Kokkos declares its launch kernels: each translation unit keeps
// its own kernel and host stub.
template <class Functor>
__global__ static void __launch_bounds__(32 * Functor::kWarps, Functor::kMinBlocksPerSM)
    kfa_cuda_team_kernel(const Functor functor) {
  extern __shared__ __align__(16) unsigned char kfa_team_scratch[];
  functor.body(CudaTeam{}, kfa_team_scratch);
}

/// The same for functors that hold tensor maps (Functor::kTensorMaps): the
/// functor is a __grid_constant__ parameter, so a member's address is a
/// parameter address, which the bulk tensor copies read (kfa/detail/backend/cuda/primitives/tma.hpp).
template <class Functor>
__global__ static void __launch_bounds__(32 * Functor::kWarps, Functor::kMinBlocksPerSM)
    kfa_cuda_team_kernel_maps(const __grid_constant__ Functor functor) {
  extern __shared__ __align__(16) unsigned char kfa_team_scratch_maps[];
  functor.body(CudaTeam{}, kfa_team_scratch_maps);
}

template <class Functor, class = void>
struct HoldsTensorMaps : std::false_type {};
template <class Functor>
struct HoldsTensorMaps<Functor, std::void_t<decltype(Functor::kTensorMaps)>>
    : std::integral_constant<bool, Functor::kTensorMaps> {};

/// Largest team scratch a launch_cuda_team kernel can have on `space`'s GPU.
inline std::size_t cuda_team_scratch_max(const Kokkos::Cuda& space) {
  return space.cuda_device_prop().sharedMemPerBlockOptin;
}

/// Runs `functor.body(team, scratch)` on `league` teams of Functor::kWarps
/// warps with `scratch_bytes` of shared memory each, on `space`'s stream.
template <class Functor>
void launch_cuda_team(const Kokkos::Cuda& space, const std::string& label,
                      const Functor& functor, int league, std::size_t scratch_bytes) {
  if (league == 0) return;
  if (scratch_bytes > cuda_team_scratch_max(space)) {
    throw std::runtime_error(label + ": the kernel's tiles need " +
                             std::to_string(scratch_bytes) + " bytes of shared memory, the GPU " +
                             "gives a block at most " +
                             std::to_string(cuda_team_scratch_max(space)));
  }
  auto check = [&](cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
      throw std::runtime_error(label + ": " + what + " failed: " + cudaGetErrorString(err));
    }
  };
  const auto kernel = [] {
    if constexpr (HoldsTensorMaps<Functor>::value)
      return &kfa_cuda_team_kernel_maps<Functor>;
    else
      return &kfa_cuda_team_kernel<Functor>;
  }();
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(scratch_bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  std::uint64_t kernel_id = 0;
  if (Kokkos::Tools::profileLibraryLoaded()) {
    Kokkos::Tools::beginParallelFor(label, Kokkos::Tools::Experimental::device_id(space),
                                    &kernel_id);
  }
  void* args[] = {const_cast<Functor*>(&functor)};
  check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(league),
                         dim3(32, Functor::kWarps), args, scratch_bytes, space.cuda_stream()),
        "cudaLaunchKernel");
  if (Kokkos::Tools::profileLibraryLoaded()) Kokkos::Tools::endParallelFor(kernel_id);
}

#endif

/// Whether `space`'s GPU gives a team of Kernel, launched by
/// launch_cuda_team, its scratch.
template <class Kernel, class ExecSpace>
bool cuda_team_fits(const ExecSpace& space) {
  return Kernel::scratch_bytes() <= cuda_team_scratch_max(space);
}

/// fits() and launch() of a kernel that always runs through
/// launch_cuda_team (the fp32/fp64 and exact fp32 kernels, the 16-bit
/// backward's O(N) passes): Kernel names its label (kLabel), its league
/// (league_size(), of its operands base for the attention kernels) and its
/// scratch_bytes().
template <class Kernel>
struct FusedTeamLaunch {
  /// Whether `space`'s GPU gives a team the kernel's scratch.
  template <class ExecSpace>
  static bool fits(const ExecSpace& space) {
    return cuda_team_fits<Kernel>(space);
  }

  template <class ExecSpace>
  void launch(const ExecSpace& space) const {
    const Kernel& kernel = static_cast<const Kernel&>(*this);
    launch_cuda_team(space, Kernel::kLabel, kernel, kernel.league_size(),
                     Kernel::scratch_bytes());
  }
};

/// Launches a tensor-core team kernel in its shape: Stages 1 through a
/// TeamPolicy of Kernel::kWarps warps (scratch checked against Kokkos'
/// limit), Stages 2 through launch_cuda_team with opt-in shared memory.
template <class Kernel, class ExecSpace>
void launch_mma_kernel(const ExecSpace& space, const char* label, const Kernel& kernel,
                       int league) {
  if constexpr (Kernel::kStages == 1) {
    using policy_t = typename Kernel::policy_t;
    if (league == 0) return;
    policy_t policy(space, league, Kernel::kWarps, 32);
    check_scratch<policy_t>(label, 0, Kernel::scratch_bytes(), Kernel::kBlockM, Kernel::kBlockN,
                            Kernel::kHeadDim);
    policy.set_scratch_size(0, Kokkos::PerTeam(Kernel::scratch_bytes()));
    Kokkos::parallel_for(label, policy, kernel);
  } else {
    launch_cuda_team(space, label, kernel, league, Kernel::scratch_bytes());
  }
}

/// Whether `space`'s GPU gives a team of Kernel its scratch (always, for the
/// TeamPolicy shapes).
template <class Kernel, class ExecSpace>
bool mma_kernel_fits(const ExecSpace& space) {
  if constexpr (Kernel::kStages == 1) {
    return true;
  } else {
    return cuda_team_fits<Kernel>(space);
  }
}

/// fits(), launch() and the TeamPolicy entry of a tensor-core kernel that
/// runs in its shape (launch_mma_kernel, mma_kernel_fits): Kernel names its
/// label (kLabel), its league (league_size()), kStages, kWarps,
/// scratch_bytes() and body(team, scratch); Policy is the TeamPolicy of its
/// Stages-1 shape.
template <class Kernel, class Policy>
struct MmaTeamLaunch {
  using policy_t = Policy;
  using member_t = typename Policy::member_type;

  /// Whether `space`'s GPU gives a team the kernel's scratch.
  static bool fits(const typename Policy::execution_space& space) {
    return mma_kernel_fits<Kernel>(space);
  }

  void launch(const typename Policy::execution_space& space) const {
    const Kernel& kernel = static_cast<const Kernel&>(*this);
    launch_mma_kernel(space, Kernel::kLabel, kernel, kernel.league_size());
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& member) const {
    static_cast<const Kernel&>(*this).body(
        member, member.team_scratch(0).get_shmem(Kernel::scratch_bytes()));
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
