#ifndef KFA_DETAIL_RING_CHECKS_HPP
#define KFA_DETAIL_RING_CHECKS_HPP

// Argument checks of ring attention, made collective. A rank that throws
// while its neighbours go on to the ring traffic would leave them waiting
// forever, so every check ends in an agreement over the communicator: when
// any rank rejects its arguments, every rank throws the same
// std::invalid_argument, before any block is sent and before any output is
// written.

#include <kfa/ring_communicator.hpp>
#include <kfa/ring_options.hpp>

#include <kfa/detail/ring/transport/transport.hpp>
#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/ring/layout.hpp>

#include <mpi.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// Runs `check` (which throws std::invalid_argument on bad local arguments)
/// on every rank, then agrees: if it threw on any rank, every rank throws
/// the message of the first rank that failed, naming that rank.
template <class Check>
void agree_on_local_checks(const RingCommunicator& comm, Check&& check) {
  std::string error;
  try {
    check();
  } catch (const std::invalid_argument& e) {
    error = e.what();
    if (error.empty()) error = "invalid argument";
  }
  const int ranks = comm.size();
  const int length = static_cast<int>(error.size());
  std::vector<int> lengths(ranks);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm.comm());
  int first = -1, failing = 0;
  for (int r = 0; r < ranks; ++r) {
    if (lengths[r] == 0) continue;
    if (first < 0) first = r;
    ++failing;
  }
  if (first < 0) return;
  std::string message = comm.rank() == first ? error : std::string(lengths[first], ' ');
  MPI_Bcast(&message[0], lengths[first], MPI_CHAR, first, comm.comm());
  std::ostringstream out;
  out << message << " (on rank " << first << " of " << ranks;
  if (failing > 1) out << ", and on " << failing - 1 << " other rank(s)";
  out << ")";
  throw std::invalid_argument(out.str());
}

/// Every rank's `record` (a trivially copyable struct), in rank order.
template <class Record>
std::vector<Record> allgather_records(const RingCommunicator& comm, const Record& record) {
  std::vector<Record> all(comm.size());
  MPI_Allgather(&record, static_cast<int>(sizeof(Record)), MPI_BYTE, all.data(),
                static_cast<int>(sizeof(Record)), MPI_BYTE, comm.comm());
  return all;
}

inline std::string extents_string(const std::uint64_t* extents, int rank) {
  std::ostringstream out;
  for (int r = 0; r < rank; ++r) out << "[" << extents[r] << "]";
  return out.str();
}

/// Local checks of ring attention beyond the single-rank ones: q, k and v
/// are slices of one sequence, sharded alike; no window or dropout; the
/// transport exists here.
template <class ExecSpace, class Q, class K>
void check_ring_local(const char* function, const Q& q, const K& k, const RingOptions& options) {
  if (k.extent(1) != q.extent(1)) {
    std::ostringstream out;
    out << "k and v must have q's local seqlen (q, k and v are slices of one sequence, "
           "sharded alike): q is "
        << Impl::extents_string(q) << ", k is " << Impl::extents_string(k);
    throw_invalid(function, out.str());
  }
  // The ring's fused calls see chunk-local positions: a sliding window or a
  // dropout mask (drawn per (i, j)) would be applied in the wrong
  // coordinates, so they are refused rather than computed wrongly.
  if (options.window_left != -1 || options.window_right != -1) {
    std::ostringstream out;
    out << "options.window_left / window_right: ring attention does not support sliding "
           "windows (leave both at -1); got window_left = "
        << options.window_left << ", window_right = " << options.window_right;
    throw_invalid(function, out.str());
  }
  if (options.dropout_p != 0) {
    std::ostringstream out;
    out << "options.dropout_p: ring attention does not support dropout (leave it at 0); got "
        << options.dropout_p;
    throw_invalid(function, out.str());
  }
  if (!ring_transport_available<ExecSpace>(options.transport)) {
    throw_invalid(function,
                  "options.transport = nccl needs kfa built with KFA_ENABLE_NCCL=ON "
                  "and a Kokkos::Cuda execution space");
  }
}

/// What must agree across the ranks of one ring attention call.
struct RingArgumentsRecord {
  std::uint64_t q[4];
  std::uint64_t heads_kv;
  std::uint64_t value_bytes;
  std::uint64_t causal, sharding, transport, deterministic, fp32_matmul;
  double softmax_scale, softcap;
};

/// Checks that the ranks' slices fit together (batch, heads, heads_kv,
/// head_dim and value type alike everywhere; the same options) and returns
/// the layout of the sequence over the ranks. Collective; throws the same
/// std::invalid_argument on every rank.
template <class T, class Q, class K>
RingLayout agree_on_ring_arguments(const char* function, const RingCommunicator& comm, const Q& q,
                                   const K& k, const RingOptions& options) {
  const RingArgumentsRecord mine{{q.extent(0), q.extent(1), q.extent(2), q.extent(3)},
                                 k.extent(2),
                                 sizeof(T),
                                 options.causal ? 1u : 0u,
                                 static_cast<std::uint64_t>(options.sharding),
                                 static_cast<std::uint64_t>(options.transport),
                                 options.deterministic ? 1u : 0u,
                                 static_cast<std::uint64_t>(options.fp32_matmul),
                                 options.softmax_scale,
                                 options.softcap};
  const std::vector<RingArgumentsRecord> all = allgather_records(comm, mine);
  std::vector<std::size_t> seqlens;
  const RingArgumentsRecord& root = all[0];
  for (std::size_t r = 0; r < all.size(); ++r) {
    const RingArgumentsRecord& other = all[r];
    std::ostringstream out;
    out << function << ": ";
    if (other.q[0] != root.q[0] || other.q[2] != root.q[2] || other.q[3] != root.q[3]) {
      out << "q is " << extents_string(root.q, 4) << " on rank 0 but " << extents_string(other.q, 4)
          << " on rank " << r
          << ": batch, heads and head_dim of [batch][seqlen][heads][head_dim] must be the "
             "same on every rank of comm (each rank holds a slice of one sequence)";
      throw std::invalid_argument(out.str());
    }
    if (other.heads_kv != root.heads_kv) {
      out << "k and v have " << root.heads_kv << " heads (heads_kv) on rank 0 but "
          << other.heads_kv << " on rank " << r << "; every rank must use the same heads_kv";
      throw std::invalid_argument(out.str());
    }
    if (other.value_bytes != root.value_bytes) {
      out << "q's value type has " << root.value_bytes << " bytes on rank 0 but "
          << other.value_bytes << " on rank " << r << "; every rank must use the same type";
      throw std::invalid_argument(out.str());
    }
    const char* option = other.causal != root.causal                 ? "causal"
                         : other.sharding != root.sharding           ? "sharding"
                         : other.transport != root.transport         ? "transport"
                         : other.deterministic != root.deterministic ? "deterministic"
                         : other.fp32_matmul != root.fp32_matmul     ? "fp32_matmul"
                         : other.softmax_scale != root.softmax_scale ? "softmax_scale"
                         : other.softcap != root.softcap             ? "softcap"
                                                                     : nullptr;
    if (option != nullptr) {
      out << "options." << option << " differs between rank 0 and rank " << r
          << "; every rank must pass the same options";
      throw std::invalid_argument(out.str());
    }
    seqlens.push_back(static_cast<std::size_t>(other.q[1]));
  }
  return RingLayout(function, options.sharding, std::move(seqlens));
}

/// What must agree across the ranks for ring_shard / ring_gather.
struct RingShardRecord {
  std::uint64_t local[4];
  std::uint64_t global[4];
  std::uint64_t rank;
  std::uint64_t value_bytes;
};

/// Checks that the local slices of all ranks tile the global tensor along
/// the sequence (dimension 1 of rank-4 Views, 2 of rank-3 ones) and returns
/// the layout. Collective; throws the same std::invalid_argument on every
/// rank.
template <class T, class Local, class Global>
RingLayout agree_on_shard_arguments(const char* function, const RingCommunicator& comm,
                                    const Local& local, const Global& global,
                                    RingSharding sharding) {
  constexpr int kRank = view_rank<Local>();
  const int seq_dim = kRank == 4 ? 1 : 2;
  RingShardRecord mine{{1, 1, 1, 1}, {1, 1, 1, 1}, kRank, sizeof(T)};
  for (int r = 0; r < kRank; ++r) {
    mine.local[r] = local.extent(r);
    mine.global[r] = global.extent(r);
  }
  const std::vector<RingShardRecord> all = allgather_records(comm, mine);
  std::vector<std::size_t> seqlens;
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const RingShardRecord& other = all[r];
    bool same = other.rank == all[0].rank && other.value_bytes == all[0].value_bytes;
    for (int d = 0; d < kRank; ++d) {
      same = same && other.global[d] == all[0].global[d];
      if (d != seq_dim) same = same && other.local[d] == other.global[d];
    }
    if (!same) {
      std::ostringstream out;
      out << function << ": on rank " << r << " local is " << extents_string(other.local, kRank)
          << " and global " << extents_string(other.global, kRank) << ", on rank 0 global is "
          << extents_string(all[0].global, kRank)
          << ": every rank must pass the same global shape, and local must match it except "
             "along the sequence ("
          << (kRank == 4 ? "[batch][seqlen][heads][head_dim]" : "[batch][heads][seqlen]") << ")";
      throw std::invalid_argument(out.str());
    }
    seqlens.push_back(static_cast<std::size_t>(other.local[seq_dim]));
    total += other.local[seq_dim];
  }
  if (total != all[0].global[seq_dim]) {
    std::ostringstream out;
    out << function << ": the local slices add up to seqlen " << total << " (";
    for (std::size_t r = 0; r < seqlens.size(); ++r) out << (r ? " + " : "") << seqlens[r];
    out << " over " << seqlens.size() << " ranks) but global has seqlen " << all[0].global[seq_dim];
    throw std::invalid_argument(out.str());
  }
  return RingLayout(function, sharding, std::move(seqlens));
}

}  // namespace Impl
}  // namespace kfa

#endif
