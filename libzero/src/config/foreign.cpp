// DeepSpeed keys that libzero has no member for, and what it does with them (the policy of
// config/keys.hpp): silent where the key changes nothing here (logging, profiling, DeepSpeed's
// own save and compile switches, features left off, performance hints with no meaning here),
// a note where libzero does the job another way, an error where honouring the key would change
// the training result and libzero cannot.
#include "config/keys.hpp"

namespace zero::keys {

const std::vector<Foreign>& foreign_keys() {
  static const std::vector<Foreign> table = {
      // Logging, profiling, monitoring, DeepSpeed's own tooling: libzero prints and logs itself.
      {"wall_clock_breakdown", Policy::silent, "", "logging"},
      {"memory_breakdown", Policy::silent, "", "logging"},
      {"flops_profiler", Policy::silent, "", "profiling"},
      {"tensorboard", Policy::silent, "", "monitoring"},
      {"wandb", Policy::silent, "", "monitoring"},
      {"csv_monitor", Policy::silent, "", "monitoring"},
      {"comet", Policy::silent, "", "monitoring"},
      {"comms_logger", Policy::silent, "", "logging"},
      {"dump_state", Policy::silent, "", "logging"},
      {"autotuning", Policy::silent, "", "DeepSpeed's launcher"},
      {"compile", Policy::silent, "", "DeepSpeed's torch.compile switch"},
      {"checkpoint", Policy::silent, "", "DeepSpeed's checkpoint options; libzero checkpoints re-slice at load"},
      {"load_universal_checkpoint", Policy::silent, "", "libzero checkpoints load at any world size"},
      {"use_node_local_storage", Policy::silent, "", "DeepSpeed's checkpoint option"},
      {"zero_allow_untested_optimizer", Policy::silent, "", "DeepSpeed's optimizer whitelist"},
      {"zero_force_ds_cpu_optimizer", Policy::silent, "", "DeepSpeed's optimizer choice"},
      {"activation_checkpointing", Policy::silent, "", "the training loop decides what to recompute"},
      {"dataloader_drop_last", Policy::silent, "", "the application owns the data"},
      // Performance hints and numerics with no meaning here, silent at their inert values.
      {"prescale_gradients", Policy::note, "false",
       "gradients are averaged once, after the reduction, in the compute dtype"},
      {"gradient_predivide_factor", Policy::note, "1|1.0", "gradients are averaged once, after the reduction"},
      // null: DeepSpeed reads None (runtime/config.py, .get), which is false to it.
      {"sparse_gradients", Policy::refused, "false|null",
       "sparse embedding gradients are not implemented; set it to false"},
      {"amp", Policy::refused, "false", "Apex AMP is not supported; use fp16 or bf16 instead"},
      {"torch_autocast", Policy::refused, "false", "torch autocast is not supported; use fp16 or bf16 instead"},
      {"fp16.auto_cast", Policy::silent, "", "the application casts its inputs"},
      {"fp16.consecutive_hysteresis", Policy::note, "false",
       "the loss scaler restores hysteresis after loss_scale_window clean steps only"},
      {"fp16.fp16_master_weights_and_grads", Policy::refused, "false", "master weights are always fp32 here"},
      {"bf16.immediate_grad_update", Policy::silent, "", "a DeepSpeed performance hint"},
      {"bf16.check_grad_overflow", Policy::silent, "", "a DeepSpeed check"},
      {"optimizer.params.amsgrad", Policy::refused, "false", "AMSGrad is not implemented"},
      {"optimizer.params.torch_adam", Policy::silent, "", "DeepSpeed's implementation choice"},
      {"optimizer.params.fused", Policy::silent, "", "DeepSpeed's implementation choice"},
      {"optimizer.params.dampening", Policy::refused, "0|0.0", "SGD dampening is not implemented"},
      // DeepSpeed's 1-bit optimizers name their transport in their params; libzero's is set by
      // backend and comm.
      {"optimizer.params.cuda_aware", Policy::note, "false",
       "the transport is chosen by backend and comm (NCCL moves device memory directly)"},
      {"optimizer.params.comm_backend_name", Policy::note, "", "the transport is chosen by backend and comm"},
      {"scheduler.params.last_batch_iteration", Policy::silent, "", "resume continues from the checkpoint's step"},
      {"curriculum_learning", Policy::refused, "false",
       "curriculum learning changes the data; the application owns the data"},
      {"data_efficiency", Policy::refused, "false",
       "data sampling and routing change the data; the application owns the data"},
      {"sparse_attention", Policy::refused, "", "sparse attention belongs to the model"},
      {"compression_training", Policy::refused, "", "compression changes the model"},
      {"elasticity", Policy::refused, "false", "elastic batch sizes change the batch; set the batch triple instead"},
      {"hybrid_engine", Policy::refused, "false", "DeepSpeed-Chat's hybrid engine is not available"},
      {"sequence_parallel_size", Policy::note, "1",
       "libzero has no sequence parallelism, so the setting changes nothing: every rank is a data-parallel "
       "rank and the training loop feeds it whole sequences"},
      {"tensor_parallel.autotp_size", Policy::refused, "0|1",
       "tensor parallelism is not implemented (data parallel only)"},
      {"pipeline.stages", Policy::refused, "1|auto",
       "the engine has no pipeline of its own: pipeline the model in the training loop over zero::ProcessGroups "
       "(zero-gpt: model.pipeline_parallel)"},
      // zero_optimization
      {"zero_optimization.allgather_partitions", Policy::silent, "", "a performance hint"},
      {"zero_optimization.round_robin_gradients", Policy::silent, "", "a performance hint"},
      {"zero_optimization.elastic_checkpoint", Policy::silent, "", "checkpoints re-slice at load"},
      {"zero_optimization.ignore_unused_parameters", Policy::silent, "", "every unit is reduced each step"},
      {"zero_optimization.load_from_fp32_weights", Policy::silent, "", "checkpoints hold the fp32 master weights"},
      {"zero_optimization.legacy_stage1", Policy::silent, "false", "an old DeepSpeed code path"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
       Policy::silent,
       "",
       "zero-ckpt export writes full weights",
       {"stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"}},
      {"zero_optimization.memory_efficient_linear", Policy::silent, "", "a DeepSpeed hint"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", Policy::silent, "", "a performance hint"},
      {"zero_optimization.stage3_module_granularity_threshold", Policy::silent, "", "the units are the layout's"},
      {"zero_optimization.pipeline_loading_checkpoint", Policy::silent, "", "a DeepSpeed hint"},
      {"zero_optimization.override_module_apply", Policy::silent, "", "a DeepSpeed hint"},
      {"zero_optimization.log_trace_cache_warnings", Policy::silent, "", "logging"},
      {"zero_optimization.use_all_reduce_for_fetch_params", Policy::silent, "", "a performance hint"},
      {"zero_optimization.model_persistence_threshold", Policy::silent, "", "a performance hint"},
      {"zero_optimization.mics_hierarchical_params_gather", Policy::silent, "",
       "a performance hint: MiCS's parameter gathers run inside its group (make it a node)"},
      {"zero_optimization.zero_quantized_nontrainable_weights", Policy::refused, "false",
       "quantized weights change the result"},
      // null: Optional fields in DeepSpeed (zero/config.py), None there is no offload.
      {"zero_optimization.cpu_offload", Policy::refused, "false|null",
       "is DeepSpeed's old spelling; write offload_optimizer: {device: cpu}"},
      {"zero_optimization.cpu_offload_params", Policy::refused, "false|null",
       "is DeepSpeed's old spelling; write offload_param: {device: cpu}"},
      {"zero_optimization.cpu_offload_use_pin_memory", Policy::silent, "", "old spelling of pin_memory"},
      {"zero_optimization.aio", Policy::refused, "",
       "DeepSpeed reads aio at the top level, not inside zero_optimization (where it has no "
       "effect); move the section to the top level"},
      {"zero_optimization.offload_optimizer.fast_init", Policy::silent, "", "a performance hint"},
      {"zero_optimization.offload_optimizer.pipeline_read", Policy::silent, "", "NVMe reads are always pipelined"},
      {"zero_optimization.offload_optimizer.pipeline_write", Policy::silent, "", "NVMe writes are always pipelined"},
      {"zero_optimization.offload_optimizer.pipeline", Policy::silent, "", "NVMe transfers are always pipelined"},
      {"zero_optimization.offload_optimizer.ratio", Policy::note, "1|1.0", "the whole optimizer shard is offloaded"},
      {"aio.use_gds", Policy::note, "false", "transfers go through host memory (no GPUDirect Storage)"},
  };
  return table;
}

}  // namespace zero::keys
