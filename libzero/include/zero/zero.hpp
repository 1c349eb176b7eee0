// libzero's training-loop API in one include; planning (zero/plan/), interchange formats
// (zero/formats/) and utilities (zero/util/) are included by name where they are used.
#pragma once

#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/config_schema.hpp"
#include "zero/context.hpp"
#include "zero/dtype.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"
#include "zero/layout.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/optim.hpp"
#include "zero/preemption.hpp"
#include "zero/settings_table.hpp"
