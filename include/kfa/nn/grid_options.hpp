#ifndef KFA_NN_GRID_OPTIONS_HPP
#define KFA_NN_GRID_OPTIONS_HPP

#include <kfa/nn/options.hpp>

namespace kfa {
namespace nn {

/// Axial rotary position embeddings of tokens that are the points of a 1D,
/// 2D or 3D grid flattened row-major (the last axis fastest): the rotary
/// features of each head are cut into `axes` equal chunks, and chunk a is a
/// 1D rotary embedding (RotaryOptions' formula with rotary_dim = the chunk's
/// width) of the token's coordinate along axis a.
struct AxialRotaryOptions {
  /// Grid axes: 1, 2 or 3.
  int axes = 2;
  /// Points along each axis (the first `axes` entries); their product is seqlen.
  int extent[3] = {1, 1, 1};
  double base = 10000;
  /// Pairs inside each axis's chunk: (j, j + chunk/2) for half_split,
  /// (2j, 2j + 1) for interleaved (EVA-02, Heo et al.'s RoPE-Axial).
  RotaryStyle style = RotaryStyle::half_split;
  /// Rotated features per head, split evenly between the axes (each share
  /// even); 0 means head_dim. The rest pass through unchanged.
  int rotary_dim = 0;
  /// Coordinate of the View's first point along each axis: a rank's
  /// sub-grid of a larger grid (negative values allowed).
  int offset[3] = {0, 0, 0};
  /// Coordinate scale per axis, angle = scale·(offset + c)·θ: position
  /// interpolation for a grid finer or coarser than the one trained on.
  double scale[3] = {1, 1, 1};
};

/// Which keys a grid neighbourhood shows a query near the borders.
enum class GridWindow {
  /// Key c_k is visible to query c_q iff |c_q[a] - c_k[a]| <= radius[a] on
  /// every axis: queries near a border see fewer keys.
  centred,
  /// NATTEN's windows: along axis a every query sees 2·radius[a] + 1 keys
  /// (the whole axis if it is shorter), the window shifted inward at the
  /// borders, so a border query sees as many keys as an inner one.
  border_shifted
};

/// Neighbourhood attention on a 1D, 2D or 3D grid flattened row-major.
struct GridNeighbourhoodOptions {
  /// Grid axes: 1, 2 or 3.
  int axes = 2;
  /// Points along each axis (the first `axes` entries); their product is
  /// the sequence length of q and of k.
  int extent[3] = {1, 1, 1};
  /// Neighbourhood radius per axis (>= 0); a radius past the grid sees the
  /// whole axis.
  int radius[3] = {0, 0, 0};
  GridWindow window = GridWindow::centred;
};

}  // namespace nn
}  // namespace kfa

#endif
