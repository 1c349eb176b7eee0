// Which optimizers take a layout with parameters split by tensor parallelism (ParamInfo::split_axis),
// and what the others say. Lamb and Adafactor sum a split tensor's statistics over the tensor group
// (OptimizerEnv::tensor), so they refuse such a layout only when the engine has no tensor group;
// Muon refuses a split matrix without one too (Newton-Schulz needs it whole, put together over the
// group) but not a split embedding, which it steps with AdamW; the element-wise optimizers take
// it. Every refusal names the parameter. (That Lamb, Adafactor and Muon are exact with a tensor
// group: test/mpi/test_gpt_tensor_parallel.cpp.)
#include <catch2/catch.hpp>

#include <string>

#include "optim/optimizer.hpp"
#include "zero/config.hpp"
#include "zero/layout.hpp"

using namespace zero;

namespace {

// A layer cut as the GPT trainer cuts it over 2 ranks: a column-parallel matrix, a row-parallel
// one, a split bias and a replicated gain; and a vocabulary-parallel embedding.
Layout split_layout() {
  Layout l;
  const int emb = l.add_unit("embeddings", {{"wte.weight", {64, 16}}});
  l.set_split(emb, "wte.weight", 0);
  l.set_embedding(emb, "wte.weight");
  const int h =
      l.add_unit("h.0", {{"ln.weight", {16}}, {"fc.weight", {16, 24}}, {"fc.bias", {24}}, {"proj.weight", {24, 16}}});
  l.set_replicated(h, "ln.weight");
  l.set_split(h, "fc.weight", 1);
  l.set_split(h, "fc.bias", 0);
  l.set_split(h, "proj.weight", 0);
  return l;
}

std::string why(OptimizerType type, const Layout& layout) {
  OptimizerConfig o;
  o.type = type;
  OptimizerEnv env;
  env.layout = &layout;
  for (int u = 0; u < layout.num_units(); ++u) env.slice.push_back(layout.slice_numel(u, 1));
  return make_optimizer(o, env)->unsupported(layout);
}

}  // namespace

TEST_CASE("Muon refuses a matrix split by tensor parallelism without a tensor group, naming it",
          "[optim][tensor_parallel]") {
  const Layout layout = split_layout();
  const std::string w = why(OptimizerType::muon, layout);
  // The embedding is split too, but AdamW steps it: the refusal names the first split matrix.
  CHECK_THAT(w, Catch::Contains("optimizer.type Muon") && Catch::Contains("'fc.weight' of unit 'h.0'") &&
                    Catch::Contains("split by tensor parallelism") && Catch::Contains("no tensor group"));
  // Only the embedding split: Muon runs (AdamW for it).
  Layout emb;
  const int u = emb.add_unit("embeddings", {{"wte.weight", {64, 16}}});
  emb.set_split(u, "wte.weight", 0);
  emb.set_embedding(u, "wte.weight");
  CHECK(why(OptimizerType::muon, emb).empty());
}

TEST_CASE("Lamb and Adafactor refuse split tensors only without a tensor group", "[optim][tensor_parallel]") {
  const Layout layout = split_layout();
  for (const auto& [type, name] :
       {std::pair{OptimizerType::lamb, "Lamb"}, std::pair{OptimizerType::adafactor, "Adafactor"},
        std::pair{OptimizerType::onebit_lamb, "OneBitLamb"}}) {
    INFO(name);
    CHECK_THAT(why(type, layout), Catch::Contains(std::string("optimizer.type ") + name) &&
                                      Catch::Contains("'wte.weight' of unit 'embeddings'") &&
                                      Catch::Contains("no tensor group"));
  }
  // Element-wise optimizers take any layout.
  for (const OptimizerType type :
       {OptimizerType::adamw, OptimizerType::adam, OptimizerType::sgd, OptimizerType::lion, OptimizerType::onebit_adam})
    CHECK(why(type, layout).empty());
}
