#ifndef KFA_NN_GRID_OPTIONS_HPP
#define KFA_NN_GRID_OPTIONS_HPP

#include <kfa/nn/options.hpp>

namespace kfa {
namespace nn {

// AxialRotaryOptions is in kfa/nn/options.hpp: the layers' options hold one.

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
