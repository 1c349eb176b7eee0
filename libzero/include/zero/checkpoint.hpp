// Checkpoints: save and resume bit for bit at any world size and ZeRO stage, also of models split
// over a tensor x pipeline grid; inspect, export and reshard offline (zero-ckpt wraps those).
// Usage: docs/checkpoints.md; why it is built so: docs/architecture.md, note checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "zero/dtype.hpp"

namespace zero {

class Engine;

// The application's own state, saved and restored verbatim: any keys, any bytes. It is saved
// once, so it must be the same on every rank (a difference is an error): keep the data position
// as a global count, and derive per-rank generators from a seed, the rank and the step, which
// also keeps them meaningful when a run resumes at another world size.
using ClientState = std::map<std::string, std::string>;

struct CheckpointOptions {
  // Complete checkpoints to keep; older ones are deleted after a save completes. 0 keeps all.
  int keep_last = 3;
};

struct CheckpointLoadOptions {
  // By default a checkpoint must come from the same compute dtype and optimizer; set this to
  // continue from one trained otherwise (the fp32 master and moments are loaded as they are).
  bool allow_config_change = false;
  // A load locks the root shared (see lock_checkpoint_root), so a job that writes it cannot
  // start meanwhile. A job that only reads and may run beside the one writing the root
  // (sampling, evaluation) sets this false; a checkpoint pruned while it reads is then an error.
  bool lock_root = true;
  // Every check of a load (the metadata, the model against the checkpoint's, on another grid
  // each parameter's cut) and a log line of what it would do, without changing the engine:
  // the client state is returned and the engine stays as it was.
  bool dry_run = false;
};

// Collective over all ranks: writes <root>/step_<global_step>/ and points <root>/latest at it.
// root must be one directory every rank sees (the same path; a shared filesystem across nodes).
// Call between steps (after step(), with no UnitParams handle alive). Saving a step that is
// already the latest checkpoint is an error; a leftover of that step from an abandoned run or
// an interrupted save is replaced. An engine built on process groups with tensor or pipeline
// parallelism (zero/groups.hpp) saves each grid position's part as its own shard set, written
// by that position's data-parallel ranks, and the step is committed once all are written.
void save_checkpoint(Engine& engine, const std::string& root, const ClientState& client = {},
                     const CheckpointOptions& opts = {});

// Collective: restores parameters, optimizer state, step counters, loss scaler and scheduler
// position from <root>/latest (tag "latest") or step N (tag "N"); returns the client state.
// `root` may also be a step directory. Replaces init_params. On failure every rank throws the
// same zero::Error and the engine refuses to train until a load or init_params succeeds.
// Under a grid each rank reads its position's part, at any data-parallel size. A checkpoint
// saved on another tensor or pipeline size is cut anew: each rank reads the saved parts that
// overlap its own (docs/checkpoints.md, "Another tensor or pipeline size").
ClientState load_checkpoint(Engine& engine, const std::string& root, const std::string& tag = "latest",
                            const CheckpointLoadOptions& opts = {});

// One job per checkpoint root. A root is locked (flock on <root>/zero.lock) by the first save
// into it (exclusively) or load from it (shared, so several jobs may start from one published
// checkpoint), and stays locked until the process ends; the lock is taken by rank 0 only, so
// the ranks of one job never refuse each other. A job that finds the root locked by another
// job gets a zero::Error naming the lock file and the holder's host and pid, instead of
// deleting that job's save in progress. The kernel releases the lock of a killed job.
//
// Collective: locks `root` (created if missing) for this job now, exclusively, so that a
// second job on the same root is refused at its start rather than at its first save. Call it
// before load_checkpoint in a run that will save into the root it resumes from. It also checks
// that every rank sees the root as the same directory (a node-local path on a multi-host job is
// refused, naming the hosts that do not see it).
void lock_checkpoint_root(Engine& engine, const std::string& root);
// The same for a job's own run directory (logs, metrics, the config it wrote), which two jobs
// must not share either, wherever their checkpoints go.
void lock_run_directory(Engine& engine, const std::string& dir);

// The bytes one save_checkpoint of this engine writes (every shard and the metadata, each file
// rounded up to the filesystem's `block` size): every grid position's under model parallelism,
// which makes it collective over the model group there.
std::uint64_t checkpoint_bytes(Engine& engine, std::uint64_t block = 4096);
// Collective, at a job's start: refuses a checkpoint root whose filesystem has less free space
// than one save (the run would train for hours and then fail its first save), and warns when
// two saves do not fit (a save is written in full before the older one is pruned). A
// filesystem that reports no capacity (ramfs) is not checked; a warning says so.
void check_checkpoint_space(Engine& engine, const std::string& root);

// ---- offline ----

// The step directory `tag` names under `root` ("latest" or a step number); root may itself be a
// step directory. Throws zero::Error when it does not exist or `latest` is malformed.
std::string resolve_checkpoint(const std::string& root, const std::string& tag = "latest");

// Steps of the checkpoints under root, ascending (directories named step_<digits>).
std::vector<std::int64_t> list_checkpoints(const std::string& root);

// Prints metadata, file sizes and checksum results for `path` (a root: every checkpoint in it;
// a step directory: that one). Returns false when any file fails verification.
bool inspect_checkpoint(const std::string& path, std::ostream& out, bool show_config = false);

// A parameter of a checkpoint's whole model (for_each_checkpoint_tensor).
struct CheckpointTensor {
  std::string unit, name;
  std::vector<std::int64_t> shape;  // the whole tensor's
};
// fn(tensor, fp32 master values) for every parameter of the whole model saved at path / tag,
// in unit order. A checkpoint of a model split over a tensor x pipeline grid is put back
// together as the export tools do (concatenated along each parameter's split axis, block by
// block; replicated parameters and a unit held by several stages taken once). One whole unit is
// in memory at a time; the values are valid during the call.
void for_each_checkpoint_tensor(const std::string& path, const std::string& tag,
                                const std::function<void(const CheckpointTensor&, std::span<const float>)>& fn);

// The same with the optimizer state: fn(tensor, arrays), arrays[0] the fp32 master and
// arrays[k] moment k of the checkpoint's optimizer (Adam's m and v; see docs/optimizers.md),
// each the whole tensor's, put together alike.
void for_each_checkpoint_state(
    const std::string& path, const std::string& tag,
    const std::function<void(const CheckpointTensor&, std::span<const std::span<const float>>)>& fn);

// Writes the consolidated master weights as a safetensors file (fp32 or bf16), one unit in memory
// at a time (a grid's parts put together, as above). Tensors are named as stored when the names
// are unique across units; when some repeat (a Layout needs them unique only within a unit), every
// tensor is named "<unit>.<parameter>" and the file's metadata says "libzero.names":
// "unit-qualified".
void export_safetensors(const std::string& path, const std::string& out_file, DType dtype = DType::f32,
                        const std::string& tag = "latest");

// Rewrites the checkpoint for `world` data-parallel ranks into out_root (a new checkpoint root
// with its own latest). stage < 0 keeps the stage recorded; any stage loads any checkpoint
// anyway, so the stage is a label for the reader. tensor, pipeline >= 1: for that grid instead
// of the saved one (< 0: unchanged), each part cut from the whole tensors as a load onto another
// grid cuts it; the pipeline may change only to 1 (the model decides how its stages cut, so
// another cut is left to the load, which knows the model). progress(done, total) after each
// shard written, in bytes. Written into a temporary directory and renamed: a failure leaves no
// partial checkpoint.
void reshard_checkpoint(const std::string& path, const std::string& out_root, int world, int stage = -1,
                        const std::string& tag = "latest", int tensor = -1, int pipeline = -1,
                        const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace zero
