// The trainer's keys as a table of libzero's settings-table mechanism (zero/settings_table.hpp),
// one row per key, in reading order: a key's default may follow a key read before it (the preset
// sets the shape, out_dir follows the preset).
#pragma once

#include "gpt/settings.hpp"
#include "zero/settings_table.hpp"

namespace zero::gpt::keys {

using Key = zero::SettingKey<GptSettings>;
using Slot = zero::SettingSlot;

const zero::SettingsTable<GptSettings>& gpt_keys();

}  // namespace zero::gpt::keys
