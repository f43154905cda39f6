#ifndef KFA_KFA_HPP
#define KFA_KFA_HPP

#include <kfa/kfa_config.hpp>
#include <kfa/dropout.hpp>
#include <kfa/flash_attention.hpp>
#include <kfa/merge_attention.hpp>
#include <kfa/options.hpp>
#include <kfa/score_mod.hpp>
#include <kfa/standard_attention.hpp>
#include <kfa/team_attention.hpp>
#include <kfa/types.hpp>
#include <kfa/version.hpp>

#if KFA_ENABLE_MPI
#include <kfa/ring_attention.hpp>
#endif

#endif
