// GPU presets, user presets from YAML, and the ring bandwidth of a cluster.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>

#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double GB = 1e9;
constexpr double TFLOPS = 1e12;

// The calibrated compute efficiency (bench/RESULTS.md, "zero-plan validation"): BLOOM-7b at
// ZeRO stage 1 on 32 A100-80GB took 29 days per 100B tokens, 17% of the A100's peak. Every
// kind starts from it until a measured MFU on that kind replaces it.
constexpr double kCalibratedEfficiency = 0.17;

GpuSpec gpu(const char* name, double mem, double tflops, double hbm_gbps, double pcie_gbps, double nvlink_gbps) {
  return GpuSpec{name, mem, tflops * TFLOPS, kCalibratedEfficiency, hbm_gbps * GB, pcie_gbps * GB, nvlink_gbps * GB};
}

}  // namespace

const std::vector<GpuSpec>& gpu_presets() {
  // Dense fp16/bf16 tensor peaks; PCIe one direction as measured in practice (gen3 12, gen4 24,
  // gen5 48 GB/s); NVLink per GPU, one direction.
  static const std::vector<GpuSpec> presets = {
      gpu("V100-16GB", 16 * GiB, 125, 900, 12, 150),  gpu("V100-32GB", 32 * GiB, 125, 900, 12, 150),
      gpu("A100-40GB", 40 * GiB, 312, 1555, 24, 300), gpu("A100-80GB", 80 * GiB, 312, 2039, 24, 300),
      gpu("H100-SXM", 80 * GiB, 989, 3350, 48, 450),  gpu("H200", 141 * GB, 989, 4800, 48, 450),
  };
  return presets;
}

GpuSpec gpu_preset(std::string_view name, const std::vector<GpuSpec>& extra) {
  std::vector<std::string> names;
  for (const auto* list : {&extra, &gpu_presets()})
    for (const auto& g : *list) {
      if (g.name == name) return g;
      names.push_back(g.name);
    }
  std::string msg = "unknown GPU kind '" + std::string(name) + "'" + did_you_mean(name, names);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  ZERO_THROW(msg + "; choose one of: " + list + ", or define it in a --gpu-file YAML");
}

std::optional<GpuSpec> gpu_preset_for_device(std::string_view device_name, double memory_bytes) {
  auto has = [&](std::string_view part) { return device_name.find(part) != std::string_view::npos; };
  const double gib = memory_bytes / GiB;
  const char* preset = nullptr;
  if (has("H200")) preset = "H200";
  // The SXM H100 reports HBM3 memory; the PCIe card (HBM2e, 756 TFLOP/s) and the NVL part are
  // other devices with other peaks.
  else if (has("H100") && (has("HBM3") || has("SXM")) && !has("PCIe") && !has("NVL"))
    preset = "H100-SXM";
  else if (has("A100"))
    preset = gib > 48 ? "A100-80GB" : "A100-40GB";
  else if (has("V100"))
    preset = gib > 20 ? "V100-32GB" : "V100-16GB";
  if (!preset) return std::nullopt;
  return gpu_preset(preset);
}

std::vector<GpuSpec> load_gpu_presets(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ZERO_THROW("cannot read GPU presets from " + path + ": " + e.what() + "; check the path and the YAML syntax");
  }
  YAML::Node list = root.IsMap() && root["gpus"] ? root["gpus"] : root;
  ZERO_CHECK(list.IsSequence(), path + ": expected a list of GPU entries (or a 'gpus:' list)");
  static const std::vector<std::string> keys = {"name",       "base",     "memory_gb", "peak_tflops",
                                                "efficiency", "hbm_gbps", "pcie_gbps", "nvlink_gbps"};
  std::vector<GpuSpec> out;
  for (const auto& e : list) {
    const std::string where = fmt::format("{}:{}", path, e.Mark().line + 1);
    ZERO_CHECK(e.IsMap(), where + ": a GPU entry must be a map with name, memory_gb, peak_tflops, ...");
    for (const auto& kv : e) {
      const auto key = kv.first.as<std::string>();
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
        ZERO_THROW(where + ": unknown key '" + key + "'" + did_you_mean(key, keys));
      }
    }
    ZERO_CHECK(e["name"], where + ": a GPU entry needs a name");
    const bool has_base = static_cast<bool>(e["base"]);
    GpuSpec g = has_base ? gpu_preset(e["base"].as<std::string>(), out) : GpuSpec{};
    g.name = e["name"].as<std::string>();
    auto number = [&](const char* key, double scale, double& field) {
      if (e[key]) {
        double v = 0;
        try {
          v = e[key].as<double>();
        } catch (const YAML::Exception&) {
          ZERO_THROW(where + ": " + key + " must be a number");
        }
        ZERO_CHECK(v > 0, where + ": " + key + " must be positive");
        field = v * scale;
      } else {
        ZERO_CHECK(has_base, where + ": GPU '" + g.name + "' lacks " + key + "; give it, or 'base: <preset>' to copy");
      }
    };
    number("memory_gb", GB, g.memory_bytes);
    number("peak_tflops", TFLOPS, g.peak_flops);
    number("efficiency", 1.0, g.efficiency);
    number("hbm_gbps", GB, g.hbm_bytes_per_s);
    number("pcie_gbps", GB, g.pcie_bytes_per_s);
    number("nvlink_gbps", GB, g.nvlink_bytes_per_s);
    ZERO_CHECK(g.efficiency <= 1.0, where + ": efficiency is a fraction of peak, at most 1");
    out.push_back(g);
  }
  return out;
}

double Cluster::ring_bytes_per_s() const {
  const double intra = intra_node_bytes_per_s > 0 ? intra_node_bytes_per_s : gpu.nvlink_bytes_per_s;
  // A ring that leaves the node crosses each node's NICs once per direction, so the bus
  // bandwidth is bounded by the per-node NIC bandwidth, whatever the GPU count per node.
  return nodes() > 1 ? std::min(intra, inter_node_bytes_per_s) : intra;
}

double Cluster::group_bytes_per_s(int size, int stride) const {
  const double intra = intra_node_bytes_per_s > 0 ? intra_node_bytes_per_s : gpu.nvlink_bytes_per_s;
  const int per_node = ranks_per_node();
  if (static_cast<std::int64_t>(size) * stride <= per_node) return intra;
  // The group's ranks on one node (consecutive in its order), and so how many groups leave the
  // node at once: with TP = 4 inside a 4-GPU node, four data-parallel rings share its NICs.
  const int members = std::max(1, std::min(size, per_node / std::max(1, stride)));
  const int groups = std::max(1, per_node / members);
  return std::min(intra, inter_node_bytes_per_s / groups);
}

}  // namespace zero::plan
