#ifndef KFA_DETAIL_RING_RING_ATTENTION_IMPL_HPP
#define KFA_DETAIL_RING_RING_ATTENTION_IMPL_HPP

// Ring attention over the ranks of a communicator (sequence parallelism).
//
// Each rank keeps its query slice and passes its key/value block around the
// ring: at step t rank r holds the block of rank (r - t) mod P. While it
// computes on that block, the next one travels into a second buffer (posted
// before the compute, waited for after). Forward: every (query chunk, key
// chunk) pair runs the fused kernel into (o_step, lse_step), which is merged
// exactly into the accumulator-type (o_acc, lse_acc) with the online-softmax
// merge. Backward: the fused backward runs per pair with the final (global)
// o and lse, so P = exp(S - lse) and D = rowsum(dO ∘ O) are the global ones
// and every pair's gradients are exact parts of the total: dQ accumulates
// locally, dK/dV accumulate in buffers that travel with the blocks and are
// back on their owner after P steps. The forward pass is never recomputed.
// Every buffer of a call is a part of one workspace (kfa/detail/common/workspace.hpp): on
// CUDA it is cached per stream between calls, so a call allocates nothing
// once the sizes have been seen.

#include <kfa/detail/attention/dispatch.hpp>
#include <kfa/detail/attention/merge_kernels.hpp>
#include <kfa/ring_communicator.hpp>
#include <kfa/ring_options.hpp>

#include <kfa/detail/ring/transport/transport.hpp>
#include <kfa/detail/ring/transport/host_staging.hpp>
#include <kfa/detail/common/workspace.hpp>
#include <kfa/detail/ring/kernels.hpp>
#include <kfa/detail/ring/layout.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// MPI tags of the two exchanges of a ring (distinct, below MPI_TAG_UB's
/// guaranteed minimum of 32767).
constexpr int kRingTagKV = 27510;
constexpr int kRingTagGrad = 25703;

/// Test hook, called with (rank, step) at the start of every ring step; the
/// rank-failure tests make it throw. Not an option: applications leave it empty.
inline std::function<void(int, int)>& ring_step_hook() {
  static std::function<void(int, int)> hook;
  return hook;
}

/// Runs the part of a ring call after the argument agreement. From there on
/// every rank waits on its neighbours' blocks, so a rank that threw would
/// leave the others blocked forever: the failure ends the job instead, with
/// the rank and the error on stderr, through MPI_Abort.
template <class Body>
void run_ring_or_abort(const char* function, const RingCommunicator& comm, Body&& body) {
  std::string error;
  try {
    body();
    return;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  std::fprintf(stderr,
               "%s: rank %d of %d failed after the ranks agreed on their arguments: %s; "
               "calling MPI_Abort (the other ranks would wait for its blocks forever)\n",
               function, comm.rank(), comm.size(), error.c_str());
  std::fflush(stderr);
  MPI_Abort(comm.comm(), 1);
}

/// Extents shared by the tensors of one kind (q, o, dq, lse: heads; k, v,
/// dk, dv: heads_kv, fewer with grouped-query attention) except the sequence.
struct RingDims {
  std::size_t batch, heads, head_dim;
  /// Elements per sequence position of a [batch][seqlen][heads][head_dim]
  /// tensor: chunk-major chunks start at multiples of it.
  std::size_t row() const { return batch * heads * head_dim; }
  /// The same for lse [batch][heads][seqlen].
  std::size_t lse_row() const { return batch * heads; }
};

template <class ExecSpace>
struct RingViews {
  using memory_space = typename ExecSpace::memory_space;
  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  template <class V>
  using Span = Kokkos::View<V*, Kokkos::LayoutRight, memory_space, unmanaged>;
  template <class V>
  using Chunk = Kokkos::View<V****, Kokkos::LayoutRight, memory_space, unmanaged>;
  template <class V>
  using LseChunk = Kokkos::View<V***, Kokkos::LayoutRight, memory_space, unmanaged>;

  template <class V>
  static Span<V> span(V* base, std::size_t n) {
    return Span<V>(base, n);
  }
  /// Chunk [offset, offset + length) of a chunk-major tensor.
  template <class V>
  static Chunk<V> chunk(V* base, const RingDims& dims, std::size_t offset, std::size_t length) {
    return Chunk<V>(base + dims.row() * offset, dims.batch, length, dims.heads, dims.head_dim);
  }
  template <class V>
  static LseChunk<V> lse_chunk(V* base, const RingDims& dims, std::size_t offset,
                               std::size_t length) {
    return LseChunk<V>(base + dims.lse_row() * offset, dims.batch, dims.heads, length);
  }
};

/// Whether a rank-local input already is chunk-major, so that the ring
/// reads the caller's memory itself: a contiguous span with one chunk, or
/// with one index outside the sequence (batch 1; for lse [batch][heads]
/// [seqlen], batch·heads 1), where the chunks of [outer][seqlen][inner]
/// follow each other in the caller's own order.
template <class UserView>
bool is_chunk_major(const UserView& user, std::size_t len0) {
  constexpr bool kLse = view_rank<UserView>() == 3;
  const std::size_t seqlen = user.extent(kLse ? 2 : 1);
  const std::size_t outer = kLse ? user.extent(0) * user.extent(1) : user.extent(0);
  return (len0 == seqlen || outer == 1) && user.span_is_contiguous();
}

/// A rank-local input in chunk-major layout: the caller's memory itself
/// where it already is, else a packed copy in `storage` (user.size()
/// elements, a workspace part reserved where !is_chunk_major).
template <class ExecSpace, class UserView, class T>
const T* chunk_major(const ExecSpace& space, const UserView& user, std::size_t len0, T* storage) {
  if (is_chunk_major(user, len0)) return user.data();
  using Span = typename RingViews<ExecSpace>::template Span<T>;
  ChunkCopy<ExecSpace, UserView, Span, true>(user, Span(storage, user.size()), len0).launch(space);
  return storage;
}

/// Reserves the part of a chunk-major copy of `user` (none where the
/// caller's memory is used as it is).
template <class UserView>
std::size_t add_chunk_major(WorkspaceParts& parts, const UserView& user, std::size_t len0) {
  return parts.add<typename UserView::non_const_value_type>(
      is_chunk_major(user, len0) ? 0 : user.size());
}

/// Per-step timings (RingOptions::profile): the time blocked waiting for
/// exchanges is the exposed communication, the rest of the step compute.
class RingStepTimer {
 public:
  using clock = std::chrono::steady_clock;
  RingStepTimer(Experimental::RingProfile* profile, clock::time_point call_start,
                const char* transport)
      : m_profile(profile), m_call_start(call_start) {
    if (m_profile) {
      *m_profile = Experimental::RingProfile();
      m_profile->transport = transport;
    }
  }
  void start_step() {
    m_step_start = clock::now();
    m_waited = 0;
  }
  /// Runs wait() (an exchange's wait) and counts its time as exposed.
  template <class Wait>
  void waiting(Wait&& wait) {
    const auto t0 = clock::now();
    wait();
    m_waited += seconds(t0, clock::now());
  }
  void end_step() {
    if (!m_profile) return;
    m_profile->compute_seconds.push_back(seconds(m_step_start, clock::now()) - m_waited);
    m_profile->exposed_comm_seconds.push_back(m_waited);
    m_waited = 0;
  }
  /// Adds waits after the last step to that step's exposed time.
  void end_after_last_step() {
    if (m_profile && !m_profile->exposed_comm_seconds.empty())
      m_profile->exposed_comm_seconds.back() += m_waited;
    if (m_profile) m_profile->total_seconds = seconds(m_call_start, clock::now());
  }

 private:
  static double seconds(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  Experimental::RingProfile* m_profile;
  clock::time_point m_call_start, m_step_start;
  double m_waited = 0;
};

/// Packs this rank's k and v into a K/V block: [K chunks][V chunks].
template <class ExecSpace, class K, class V, class T>
void pack_kv_block(const ExecSpace& space, const K& k, const V& v, T* block, const RingDims& dims,
                   std::size_t seqlen, std::size_t len0) {
  using Span = typename RingViews<ExecSpace>::template Span<T>;
  const Span k_part(block, dims.row() * seqlen),
      v_part(block + dims.row() * seqlen, dims.row() * seqlen);
  ChunkCopy<ExecSpace, K, Span, true>(k, k_part, len0).launch(space);
  ChunkCopy<ExecSpace, V, Span, true>(v, v_part, len0).launch(space);
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void ring_forward(const ExecSpace& space, const RingCommunicator& comm, const RingLayout& layout,
                  const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                  const RingOptions& options, std::chrono::steady_clock::time_point call_start) {
  using T = typename Q::non_const_value_type;
  using acc_t = accumulator_t<T>;
  using views = RingViews<ExecSpace>;
  const int ranks = layout.ranks(), rank = comm.rank();
  const RingDims dims{q.extent(0), q.extent(2), q.extent(3)};
  const RingDims kv_dims{k.extent(0), k.extent(2), k.extent(3)};
  const std::vector<RingChunk>& mine = layout.chunks(rank);
  const std::size_t seqlen = layout.seqlen(rank), len0 = mine[0].length;

  // The workspace: q chunk-major (where the caller's is not), the K/V
  // block held now and the one arriving, the accumulators (o_acc, lse_acc)
  // and one pair's output (o_step, lse_step).
  const std::size_t block_capacity = 2 * kv_dims.row() * layout.max_seqlen();
  WorkspaceParts parts;
  const std::size_t at_q = add_chunk_major(parts, q, len0);
  const std::size_t at_kv[2] = {parts.add<T>(block_capacity), parts.add<T>(block_capacity)};
  const std::size_t at_o_acc = parts.add<acc_t>(dims.row() * seqlen);
  const std::size_t at_lse_acc = parts.add<acc_t>(dims.lse_row() * seqlen);
  const std::size_t at_o_step = parts.add<T>(dims.row() * layout.max_chunk());
  const std::size_t at_lse_step = parts.add<acc_t>(dims.lse_row() * layout.max_chunk());
  const auto ws =
      workspace(space, WorkspaceSlot::ring_forward, parts.bytes(), "kfa::ring::fwd::workspace");
  T* const kv[2] = {parts.part<T>(ws, at_kv[0]), parts.part<T>(ws, at_kv[1])};
  const auto o_acc = views::span(parts.part<acc_t>(ws, at_o_acc), dims.row() * seqlen);
  const auto lse_acc = views::span(parts.part<acc_t>(ws, at_lse_acc), dims.lse_row() * seqlen);
  T* const o_step = parts.part<T>(ws, at_o_step);
  acc_t* const lse_step = parts.part<acc_t>(ws, at_lse_step);

  const T* const q_data = chunk_major(space, q, len0, parts.part<T>(ws, at_q));
  pack_kv_block(space, k, v, kv[0], kv_dims, seqlen, len0);
  Kokkos::deep_copy(space, o_acc, acc_t(0));
  Kokkos::deep_copy(space, lse_acc, math::neg_inf<acc_t>());

  const auto exchange = make_ring_exchange<ExecSpace>(comm, options.transport, kRingTagKV);
  RingStepTimer timer(options.profile, call_start, exchange->name());
  AttentionOptions block_options = options;
  for (int step = 0; step < ranks; ++step) {
    const int source = (rank - step + ranks) % ranks;
    const int next_source = (source + ranks - 1) % ranks;
    if (ring_step_hook()) ring_step_hook()(rank, step);
    const T* k_block = kv[step % 2];
    const T* v_block = k_block + kv_dims.row() * layout.seqlen(source);
    timer.start_step();
    if (step + 1 < ranks) {
      exchange->start(
          space, {k_block, sizeof(T) * 2 * kv_dims.row() * layout.seqlen(source),
                  kv[(step + 1) % 2], sizeof(T) * 2 * kv_dims.row() * layout.seqlen(next_source)});
    }
    for (const RingChunk& qc : mine) {
      for (const RingChunk& kc : layout.chunks(source)) {
        const BlockKind kind = classify(qc, kc, options.causal);
        if (kind == BlockKind::skip) continue;
        block_options.causal = kind == BlockKind::diagonal;
        const auto o_block = views::chunk(o_step, dims, 0, qc.length);
        const auto lse_block = views::lse_chunk(lse_step, dims, 0, qc.length);
        const auto q_block = views::chunk(q_data, dims, qc.local_offset, qc.length);
        const auto k_chunk = views::chunk(k_block, kv_dims, kc.local_offset, kc.length);
        dispatch_forward(space, in4(q_block), in4(k_chunk),
                         in4(views::chunk(v_block, kv_dims, kc.local_offset, kc.length)),
                         out4(o_block), out3(lse_block), batch_sequences(q_block, k_chunk),
                         block_options, NoScoreMod{});
        merge_attention_into(space, views::chunk(o_acc.data(), dims, qc.local_offset, qc.length),
                             views::lse_chunk(lse_acc.data(), dims, qc.local_offset, qc.length),
                             o_block, lse_block);
        exchange->progress();
      }
    }
    // The step's kernels are done (and the next block has travelled as far
    // as MPI progress allowed); whatever is left of the exchange is exposed.
    fence_polling(space, [&] { exchange->progress(); });
    timer.waiting([&] { exchange->wait(space); });
    timer.end_step();
  }

  using AccSpan = typename views::template Span<acc_t>;
  ChunkCopy<ExecSpace, O, AccSpan, false>(o, o_acc, len0).launch(space);
  ChunkCopy<ExecSpace, Lse, AccSpan, false>(lse, lse_acc, len0).launch(space);
  timer.end_after_last_step();
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV>
void ring_backward(const ExecSpace& space, const RingCommunicator& comm, const RingLayout& layout,
                   const Q& q, const K& k, const V& v, const O& o, const Lse& lse, const DO& d_o,
                   const DQ& dq, const DK& dk, const DV& dv, const RingOptions& options,
                   std::chrono::steady_clock::time_point call_start) {
  using T = typename Q::non_const_value_type;
  using acc_t = accumulator_t<T>;
  using views = RingViews<ExecSpace>;
  using AccSpan = typename views::template Span<acc_t>;
  const int ranks = layout.ranks(), rank = comm.rank();
  const RingDims dims{q.extent(0), q.extent(2), q.extent(3)};
  const RingDims kv_dims{k.extent(0), k.extent(2), k.extent(3)};
  const std::size_t row = dims.row(), kv_row = kv_dims.row();
  const std::vector<RingChunk>& mine = layout.chunks(rank);
  const std::size_t seqlen = layout.seqlen(rank), len0 = mine[0].length;

  // The workspace: q, o, dO and lse chunk-major (those of the caller's
  // that are not); K/V blocks as in the forward pass, and the dK/dV
  // accumulators of the block held now ([dK chunks][dV chunks], accumulator
  // type) and of the next one, which travel one step behind the K/V blocks;
  // this rank's contribution to the held block's dK/dV (grad_local),
  // computed while the accumulators of the ranks before it are still on
  // their way; dQ's accumulator, and one pair's dQ, dK and dV.
  const std::size_t block_capacity = 2 * kv_row * layout.max_seqlen();
  using LseT = typename Lse::non_const_value_type;
  WorkspaceParts parts;
  const std::size_t at_q = add_chunk_major(parts, q, len0), at_o = add_chunk_major(parts, o, len0),
                    at_do = add_chunk_major(parts, d_o, len0),
                    at_lse = add_chunk_major(parts, lse, len0);
  const std::size_t at_kv[2] = {parts.add<T>(block_capacity), parts.add<T>(block_capacity)};
  const std::size_t at_grad[2] = {parts.add<acc_t>(block_capacity),
                                  parts.add<acc_t>(block_capacity)};
  const std::size_t at_grad_local = parts.add<acc_t>(block_capacity);
  const std::size_t at_dq_acc = parts.add<acc_t>(row * seqlen);
  const std::size_t at_steps[3] = {parts.add<T>(row * layout.max_chunk()),
                                   parts.add<T>(kv_row * layout.max_chunk()),
                                   parts.add<T>(kv_row * layout.max_chunk())};
  const auto ws =
      workspace(space, WorkspaceSlot::ring_backward, parts.bytes(), "kfa::ring::bwd::workspace");
  T* const kv[2] = {parts.part<T>(ws, at_kv[0]), parts.part<T>(ws, at_kv[1])};
  acc_t* const grad[2] = {parts.part<acc_t>(ws, at_grad[0]), parts.part<acc_t>(ws, at_grad[1])};
  acc_t* const grad_local = parts.part<acc_t>(ws, at_grad_local);
  const AccSpan dq_acc = views::span(parts.part<acc_t>(ws, at_dq_acc), row * seqlen);
  T* const dq_step = parts.part<T>(ws, at_steps[0]);
  T* const dk_step = parts.part<T>(ws, at_steps[1]);
  T* const dv_step = parts.part<T>(ws, at_steps[2]);

  const T* const q_data = chunk_major(space, q, len0, parts.part<T>(ws, at_q));
  const T* const o_data = chunk_major(space, o, len0, parts.part<T>(ws, at_o));
  const T* const do_data = chunk_major(space, d_o, len0, parts.part<T>(ws, at_do));
  const LseT* const lse_data = chunk_major(space, lse, len0, parts.part<LseT>(ws, at_lse));
  pack_kv_block(space, k, v, kv[0], kv_dims, seqlen, len0);
  Kokkos::deep_copy(space, dq_acc, acc_t(0));

  const auto kv_exchange = make_ring_exchange<ExecSpace>(comm, options.transport, kRingTagKV);
  const auto grad_exchange = make_ring_exchange<ExecSpace>(comm, options.transport, kRingTagGrad);
  const auto progress = [&] {
    kv_exchange->progress();
    grad_exchange->progress();
  };
  RingStepTimer timer(options.profile, call_start, kv_exchange->name());
  AttentionOptions block_options = options;
  for (int step = 0; step < ranks; ++step) {
    const int source = (rank - step + ranks) % ranks;
    const int next_source = (source + ranks - 1) % ranks;
    if (ring_step_hook()) ring_step_hook()(rank, step);
    const std::size_t block = kv_row * layout.seqlen(source);
    const std::size_t next_block = kv_row * layout.seqlen(next_source);
    const T* k_block = kv[step % 2];
    const T* v_block = k_block + block;
    timer.start_step();
    if (step + 1 < ranks) {
      kv_exchange->start(
          space, {k_block, sizeof(T) * 2 * block, kv[(step + 1) % 2], sizeof(T) * 2 * next_block});
    }
    // This rank's part of the held block's dK/dV: at the first step straight
    // into the block's accumulator (the block is this rank's own, nothing
    // has arrived for it), later into grad_local while the accumulator is
    // on its way from the previous rank.
    acc_t* const grad_mine = step == 0 ? grad[0] : grad_local;
    Kokkos::deep_copy(space, views::span(grad_mine, 2 * block), acc_t(0));
    for (const RingChunk& qc : mine) {
      for (const RingChunk& kc : layout.chunks(source)) {
        const BlockKind kind = classify(qc, kc, options.causal);
        if (kind == BlockKind::skip) continue;
        block_options.causal = kind == BlockKind::diagonal;
        const std::size_t qo = qc.local_offset, ql = qc.length;
        const std::size_t ko = kc.local_offset, kl = kc.length;
        const auto q_block = views::chunk(q_data, dims, qo, ql);
        const auto k_chunk = views::chunk(k_block, kv_dims, ko, kl);
        dispatch_backward(space, in4(q_block), in4(k_chunk),
                          in4(views::chunk(v_block, kv_dims, ko, kl)),
                          in4(views::chunk(o_data, dims, qo, ql)),
                          in3(views::lse_chunk(lse_data, dims, qo, ql)),
                          in4(views::chunk(do_data, dims, qo, ql)),
                          out4(views::chunk(dq_step, dims, 0, ql)),
                          out4(views::chunk(dk_step, kv_dims, 0, kl)),
                          out4(views::chunk(dv_step, kv_dims, 0, kl)),
                          batch_sequences(q_block, k_chunk), block_options, NoScoreMod{});
        using StepSpan = typename views::template Span<T>;
        Accumulate<ExecSpace, AccSpan, StepSpan>(views::span(dq_acc.data() + row * qo, row * ql),
                                                 views::span(dq_step, row * ql))
            .launch(space);
        Accumulate<ExecSpace, AccSpan, StepSpan>(views::span(grad_mine + kv_row * ko, kv_row * kl),
                                                 views::span(dk_step, kv_row * kl))
            .launch(space);
        Accumulate<ExecSpace, AccSpan, StepSpan>(
            views::span(grad_mine + block + kv_row * ko, kv_row * kl),
            views::span(dv_step, kv_row * kl))
            .launch(space);
        progress();
      }
    }
    fence_polling(space, progress);
    // The held block's accumulators arrive from the previous rank (none at
    // the first step: the block is this rank's own, no one has seen it
    // yet, and grad[0] holds this rank's part already); this rank's part
    // is added and they go on to the next rank,
    // which holds the block at its next step. After P steps every block's
    // accumulators are complete and back on their owner.
    const AccSpan grad_block = views::span(grad[step % 2], 2 * block);
    if (step > 0) {
      timer.waiting([&] { grad_exchange->wait(space); });
      Accumulate<ExecSpace, AccSpan, AccSpan>(grad_block, views::span(grad_local, 2 * block))
          .launch(space);
    }
    if (ranks > 1) {
      grad_exchange->start(space, {grad_block.data(), sizeof(acc_t) * 2 * block,
                                   grad[(step + 1) % 2], sizeof(acc_t) * 2 * next_block});
    }
    timer.waiting([&] { kv_exchange->wait(space); });
    timer.end_step();
  }
  timer.waiting([&] { grad_exchange->wait(space); });

  const acc_t* own_grad = grad[ranks > 1 ? ranks % 2 : 0];
  const std::size_t own = kv_row * seqlen;
  using ConstAccSpan = typename views::template Span<const acc_t>;
  ChunkCopy<ExecSpace, DQ, AccSpan, false>(dq, dq_acc, len0).launch(space);
  ChunkCopy<ExecSpace, DK, ConstAccSpan, false>(dk, views::span(own_grad, own), len0).launch(space);
  ChunkCopy<ExecSpace, DV, ConstAccSpan, false>(dv, views::span(own_grad + own, own), len0)
      .launch(space);
  timer.end_after_last_step();
}

template <class ExecSpace, class Global, class Local>
void ring_shard_impl(const ExecSpace& space, const RingLayout& layout, int rank,
                     const Global& global, const Local& local) {
  ShardCopy<ExecSpace, Global, Local, ShardMap>(global, local, layout.shard_map(rank))
      .launch(space);
}

/// Every rank's slice, assembled on the host into the global tensor.
template <class ExecSpace, class Local, class Global>
void ring_gather_impl(const ExecSpace& space, const RingCommunicator& comm,
                      const RingLayout& layout, const Local& local, const Global& global,
                      const char* function) {
  using T = typename Local::non_const_value_type;
  constexpr int kRank = view_rank<Local>();
  const int ranks = layout.ranks();
  // Elements per sequence position, and how the position splits an index:
  // [outer][seqlen][inner] with outer = batch, inner = heads·head_dim
  // (rank 4), or outer = batch·heads, inner = 1 (rank 3).
  const std::size_t outer = kRank == 4 ? local.extent(0) : local.extent(0) * local.extent(1);
  const std::size_t inner = kRank == 4 ? local.extent(2) * local.extent(3) : 1;
  std::vector<int> counts(ranks), displs(ranks);
  std::size_t total = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::size_t n = outer * layout.seqlen(r) * inner;
    if (total + n > static_cast<std::size_t>(INT_MAX)) {
      throw_invalid(function,
                    "the global tensor has more than INT_MAX elements, more than "
                    "one MPI_Allgatherv can move");
    }
    counts[r] = static_cast<int>(n);
    displs[r] = static_cast<int>(total);
    total += n;
  }
  // The local slice is read on the host: the work that wrote it must be done.
  space.fence();
  const auto host_local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local);
  const std::size_t seqlen = layout.seqlen(comm.rank());
  std::vector<T> send(outer * seqlen * inner), all(total);
  const auto at = [](const auto& view, std::size_t a, std::size_t i, std::size_t c) -> auto& {
    if constexpr (kRank == 4) {
      return view(a, i, c / view.extent(3), c % view.extent(3));
    } else {
      return view(a / view.extent(1), a % view.extent(1), i);
    }
  };
  std::size_t n = 0;
  for (std::size_t a = 0; a < outer; ++a)
    for (std::size_t i = 0; i < seqlen; ++i)
      for (std::size_t c = 0; c < inner; ++c) send[n++] = at(host_local, a, i, c);
  MPI_Datatype type;
  MPI_Type_contiguous(static_cast<int>(sizeof(T)), MPI_BYTE, &type);
  MPI_Type_commit(&type);
  MPI_Allgatherv(send.data(), counts[comm.rank()], type, all.data(), counts.data(), displs.data(),
                 type, comm.comm());
  MPI_Type_free(&type);

  const auto host_global = Kokkos::create_mirror_view(Kokkos::HostSpace(), global);
  for (int r = 0; r < ranks; ++r) {
    const ShardMap map = layout.shard_map(r);
    std::size_t m = static_cast<std::size_t>(displs[r]);
    for (std::size_t a = 0; a < outer; ++a)
      for (std::size_t i = 0; i < layout.seqlen(r); ++i)
        for (std::size_t c = 0; c < inner; ++c) at(host_global, a, map.global(i), c) = all[m++];
  }
  Kokkos::deep_copy(space, global, host_global);
  // host_global is freed on return.
  space.fence();
}

}  // namespace Impl
}  // namespace kfa

#endif
