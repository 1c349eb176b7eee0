// The on-disk checkpoint format: files, headers, metadata, shards, and a reader that trusts nothing.
//
// A checkpoint is one directory per step, <root>/step_00000010/, holding
//   metadata.ckpt        JSON: layout, counters, loss scaler, scheduler, client state, config
//   shard_00000.ckpt ... one per saving rank: fp32 master and optimizer moments
//   rank_state_00000.ckpt ... with PowerSGD, qgZ or a 1-bit optimizer, one per rank: its own
//                        state (PowerSGD's error buffers and Q, qgZ's error-feedback buffers,
//                        the 1-bit exchange's errors and shared momentum), which differs
//                        between ranks and cannot be resliced
// and <root>/latest names the newest complete one ("step_00000010\n").
//
// Every .ckpt file starts with a 64-byte header: magic "ZEROCKPT", format version, kind, payload
// size, the size and checksum of the payload's index, and a checksum of the header itself. For
// metadata the index is the whole payload. A shard's index records whose shard it is (data-parallel
// rank and world size, stage, grid position, step) and lists, per unit, the element range it
// holds and the offset and checksum of that unit's section (master, then each moment), so a
// loader verifies exactly the sections it reads, one unit at a time, and never needs the whole
// model in memory.
//
// A shard of a checkpoint saved by N ranks holds slice r of each unit for world N, clipped to the
// unit's real elements: the slices of all shards, concatenated, are the full unit. That is true
// at every stage (at stage 0 each rank saves its slice of the replicated state), so a checkpoint
// loads into any world size and stage by cutting new ranges out of the old slices.
// Compute-dtype parameters are not stored: they are the master rounded to the compute dtype,
// which is also what the optimizer writes every step.
//
// A model split over a tensor x pipeline grid (zero/groups.hpp) saves one shard set per grid
// position (t, p) into the same step directory, shard_t01_p00_00003.ckpt being data-parallel
// rank 3's shard of position (1, 0); the metadata's "grid" lists every position's units
// (with each parameter's split axis and blocks, or replicated) and shards, and the counters
// once. Within a position everything above holds: its shards tile its units, and it loads into
// any data-parallel size. The step is committed (renamed, `latest` moved) once every position's
// shards are written, so a checkpoint is complete only as a whole.
//
// All integers are little-endian; the payload's floats are stored in the host's order, which
// the build requires to be little-endian too. Every checksum is XXH3-64 (seed 0) of the bytes it
// covers, so a file can be checked without libzero: `xxhsum -H3` of the header's first 56 bytes,
// of the index, or of one section (`dd` cuts them out) gives the stored value.
//
// The code follows the format's parts: checkpoint/format.cpp (files, names, headers),
// checkpoint/metadata.cpp, checkpoint/shards.cpp (writer and checked reader) and
// checkpoint/directory.cpp (latest, tags, the atomic commit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/checkpoint.hpp"
#include "zero/dtype.hpp"
#include "zero/layout.hpp"
#include "zero/loss_scaler.hpp"

namespace zero::ckpt {

// 1: libzero 0.1.0 (its own 64-bit checksum; client state as escaped strings).
// 2: XXH3-64 checksums; client state as hex; enum names as the config spells them ("AdamW").
// 3: each shard's index records the grid position (tensor, pipeline) it was written for, in
//    what format 2 kept as a reserved zero word; everything else as format 2. Format 2 is read
//    still (its shards record no position, so where they lie is taken on trust).
constexpr std::uint32_t kFormatVersion = 3;
constexpr std::uint32_t kOldestReadableFormat = 2;
constexpr std::size_t kHeaderBytes = 64;
enum class FileKind : std::uint32_t { metadata = 1, shard = 2, rank_state = 3 };

inline const char* kMetadataFile = "metadata.ckpt";
inline const char* kLatestFile = "latest";
std::string shard_file_name(int rank);  // shard_00003.ckpt
// A grid position's shard: shard_t01_p00_00003.ckpt (tensor rank 1, pipeline part 0, rank 3).
std::string shard_file_name(int rank, int tensor, int pipeline);
std::string rank_state_file_name(int rank);    // rank_state_00003.ckpt
std::string step_dir_name(std::int64_t step);  // step_00000010
// The step of a directory name "step_<digits>" (8 or more digits), or -1.
std::int64_t parse_step_dir_name(const std::string& name);

// ---------------------------------------------------------------- files

// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  Fd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  const std::string& path() const { return path_; }
  explicit operator bool() const { return fd_ >= 0; }
  void close();  // reports a failing close (delayed write errors) as a zero::Error

  static Fd open_read(const std::string& path);
  // Creates a new file (fails if it exists).
  static Fd create(const std::string& path);

  std::uint64_t size() const;
  void pwrite_all(const void* data, std::size_t bytes, std::uint64_t offset) const;
  void pread_all(void* data, std::size_t bytes, std::uint64_t offset) const;
  void sync() const;

 private:
  int fd_ = -1;
  std::string path_;
};

void fsync_dir(const std::string& dir);

// A file written under a temporary name (path + ".tmp") and renamed to `path` only when
// complete, so no reader ever takes a half-written export for a whole one; an unfinished
// file is removed on destruction.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // replaces a stale temporary file
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const Fd& fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void commit();  // fsync, close and rename into place

 private:
  std::string path_, tmp_;
  Fd fd_;
};
// Writes `content` to dir/name through a temporary file, fsync, rename and a directory fsync,
// so a reader sees the old content or the new one, never a mix.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content);

// ---------------------------------------------------------------- headers

struct FileHeader {
  std::uint32_t version = kFormatVersion;  // as read: kOldestReadableFormat..kFormatVersion
  FileKind kind = FileKind::metadata;
  std::uint64_t payload_bytes = 0;
  std::uint64_t index_bytes = 0;
  std::uint64_t index_checksum = 0;
};
void encode_header(const FileHeader& h, unsigned char out[kHeaderBytes]);
// Creates `path` holding the header of `kind` and the payload `index` then `data`, fsync'd.
void write_small_file(const std::string& path, FileKind kind, const std::string& index, const std::string& data = {});
// Checks the file size, magic, version, header checksum and kind; errors name `path`. A file of
// a format version this build does not read is refused with the libzero release that writes it.
FileHeader read_header(const Fd& f, FileKind expect);
// The file's index (its first index_bytes payload bytes), checked against the header.
std::string read_index(const Fd& f, const FileHeader& h);

// XXH3-64, seed 0 (what `xxhsum -H3` prints).
std::uint64_t checksum(const void* data, std::size_t bytes);

// ---------------------------------------------------------------- metadata

struct ParamMeta {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0, offset = 0;
  // Under tensor parallelism (zero::ParamInfo): the same on every tensor rank, or cut along
  // split_axis with split_blocks blocks each cut T ways. Written only when set.
  bool replicated = false;
  int split_axis = -1, split_blocks = 1;
};
struct UnitMeta {
  std::string name;
  std::int64_t numel = 0, slice = 0;  // slice: elements per rank slice at the saving world size
  std::vector<ParamMeta> params;
};
// A layout's unit as the metadata records it, with its slice at the saving world size.
UnitMeta unit_meta(const UnitInfo& u, std::int64_t slice);
struct ShardMeta {
  std::string file;
  std::uint64_t bytes = 0;           // whole file
  std::uint64_t index_checksum = 0;  // binds the shard to this metadata
};
// One position of a model-parallel grid: its part of the model and its shard set.
struct PositionMeta {
  int tensor = 0, pipeline = 0;
  std::vector<UnitMeta> units;
  std::vector<ShardMeta> shards;
};
// The tensor x pipeline grid a checkpoint was saved on (1 x 1: none, as every checkpoint
// before grids).
struct GridMeta {
  int tensor = 1, pipeline = 1;
  bool split() const { return tensor * pipeline > 1; }
  std::string describe() const;  // "TP 2 x PP 1"
};

struct Metadata {
  std::uint32_t format_version = kFormatVersion;  // as read (written: always kFormatVersion)
  std::int64_t step = 0, applied = 0;
  int world = 1, stage = 0;  // world: the data-parallel ranks that saved (each position's, with a grid)
  DType compute_dtype = DType::f32;
  std::string optimizer;  // to_string(OptimizerType): AdamW | Adam | SGD ...
  int moments = 2;        // fp32 arrays besides the master: Adam 2 (m, v), SGD 1 (momentum), OneBitLamb 3
  bool scaler_dynamic = false;
  LossScaler::State scaler{1.0, 0, 0, -1};
  std::string scheduler;
  std::int64_t scheduler_step = 0;
  std::optional<double> loop_lr;  // the rate the loop set (Engine::set_lr); absent when it set none
  // The units and shards of one position: the whole model's without a grid; with one, those
  // of the position a Reader opened (positions holds them all).
  std::vector<UnitMeta> units;
  std::vector<ShardMeta> shards;
  GridMeta grid;
  std::vector<PositionMeta> positions;  // with a grid: tensor fastest, index t + T x p
  // Per-rank state beside the shards (EngineState::rank_state), one file per rank of `world`;
  // empty when the engine kept none. Kind: "powersgd", "qgz" or "onebit"; layout: what else it belongs to
  // (EngineState::rank_state_layout; "" when nothing, and absent from the JSON then).
  std::string rank_state_kind;
  std::string rank_state_layout;
  std::vector<ShardMeta> rank_state;
  // The optimizer's per-tensor values (EngineState::tensor_records: OneBitLamb's trust ratios,
  // last factors and scaling coefficients), named arrays of one value per parameter in the
  // units' order (or empty: not set yet); the same at every world size and stage, so a reshard
  // keeps them. Written only when the optimizer keeps some (JSON "optimizer_tensors"), never with
  // a grid (the 1-bit optimizers run without tensor or pipeline parallelism).
  std::map<std::string, std::vector<double>> tensor_records;
  ClientState client;
  std::string config_yaml;

  std::string to_json() const;
  // The position at grid coordinates (t, p); throws naming the grid when outside it.
  const PositionMeta& position(int tensor, int pipeline) const;
  // Strict: every field present with its type and range, nothing unknown, and the grid's
  // positions in agreement (position_disagreements); errors name `origin` and the field.
  static Metadata parse(const std::string& text, const std::string& origin);
};

// The cross-position checks of a grid checkpoint, one line per disagreement (empty when none,
// and always without a grid): every tensor rank of a pipeline part holds the units and
// parameters of tensor rank 0 there, in the same order, with the same names, shapes (each its
// own part's) and split (replicated, axis, blocks). A checkpoint that breaks one cannot be put
// back together (the export tools) nor resumed (each rank's part would describe another
// model). Metadata::parse runs it, so every reader (load_checkpoint, ModelReader and the
// exports, reshard, zero-ckpt inspect) refuses the same checkpoints with the same words, and
// write_metadata_file runs it so that no save writes one.
std::vector<std::string> position_disagreements(const Metadata& m);

// One position as JSON text and back (a save sends each position's part to the rank that
// writes the metadata); the parse is as strict as Metadata::parse and names `origin`.
std::string position_to_json(const PositionMeta& p, int world);
PositionMeta position_from_json(const std::string& text, int world, int tensor, int pipeline,
                                const std::string& origin);

void write_metadata_file(const std::string& path, const Metadata& m);
Metadata read_metadata_file(const std::string& path);

// ---------------------------------------------------------------- shards

// Writes one shard: sections in unit order, then the index and header, then fsync.
class ShardWriter {
 public:
  struct Range {
    std::int64_t begin = 0, len = 0;
  };
  // tensor, pipeline: the grid position the shard belongs to ((0, 0) without a grid), recorded
  // in its index so that a shard found in another position's place is refused.
  ShardWriter(const std::string& path, int rank, int world, int stage, int moments, std::int64_t step,
              std::vector<Range> ranges, int tensor = 0, int pipeline = 0);
  // The next unit's section: (1 + moments) * len floats, master first then each moment.
  void add_section(const float* section);
  int next_unit() const { return next_; }
  // Completes the file; returns {file bytes, index checksum}.
  ShardMeta finish();

 private:
  Fd fd_;
  std::string path_;
  int rank_, world_, stage_, moments_, tensor_, pipeline_;
  std::int64_t step_;
  std::vector<Range> ranges_;
  std::vector<std::uint64_t> sums_;
  std::uint64_t offset_ = 0;  // payload offset of the next section
  std::uint64_t index_bytes_ = 0;
  int next_ = 0;
};

// A rank-state file: one fp32 array, its checksum in the header (the whole payload is the index).
ShardMeta write_rank_state_file(const std::string& path, const std::vector<float>& values);
// Reads and checks it against what the metadata recorded (size and checksum).
std::vector<float> read_rank_state_file(const std::string& path, const ShardMeta& expect);

// The size of a shard file holding `elements` floats of each of 1 + moments arrays over `units` units.
std::uint64_t shard_file_bytes(std::size_t units, int moments, std::uint64_t elements);

// Reads a checkpoint directory: metadata parsed and every shard's header and index checked
// against it on open; sections are verified when read. With a grid, the Reader reads the shard
// set of one position (tensor, pipeline): meta().units and meta().shards are that position's.
// A shard must lie where it was written: the position (format 3) and data-parallel rank its
// index records are those of the place it is found in, or the error names both.
class Reader {
 public:
  explicit Reader(const std::string& step_dir, int tensor = 0, int pipeline = 0);
  // An already parsed metadata of step_dir (the full-model reader opens every position).
  Reader(const std::string& step_dir, const Metadata& meta, int tensor, int pipeline);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const Metadata& meta() const { return meta_; }
  const std::string& dir() const { return dir_; }

  // Elements [begin, begin + len) of unit's state (positions >= numel read as 0) into out[0]
  // (the master) and out[k] (moment k); out may be shorter than 1 + moments, any entry null.
  void read_range(int unit, std::int64_t begin, std::int64_t len, std::span<float* const> out);
  // `len` elements of a unit from element `from`, stored at out[k] + to.
  struct Run {
    std::int64_t from = 0, len = 0, to = 0;
  };
  // Copies each run's elements that the shards hold (the rest of out is left as it is), reading
  // and verifying each section that overlaps a run once: what a load onto another grid reads.
  void read_runs(int unit, std::span<const Run> runs, std::span<float* const> out);
  // Reads and checks every section of shard `rank` (inspect); one section in memory at a time.
  void verify_shard(int rank);

 private:
  struct Shard;
  void read_section(Shard& s, int unit, std::vector<float>& buf);
  std::string dir_;
  Metadata meta_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

// The whole model of a checkpoint, whatever grid saved it: what the export tools read. Without a
// grid it is the checkpoint's own units. With one, the units of every pipeline part in part
// order; a unit name in more than one part (GPT's tied embedding, held by the first and the
// last) is one unit, each parameter taken from the lowest part that holds it. A parameter cut
// over the tensor group is its T parts concatenated along split_axis (with split_blocks > 1,
// block by block: [q_0 q_1 | k_0 k_1 | v_0 v_1]); a replicated one is tensor rank 0's. A
// parameter that is neither, under T > 1, cannot be put back together: an error names it.
class ModelReader {
 public:
  explicit ModelReader(const std::string& step_dir);
  ~ModelReader();
  ModelReader(const ModelReader&) = delete;
  ModelReader& operator=(const ModelReader&) = delete;

  // The counters, config and client state as saved; units: the whole model's (shapes whole,
  // offsets within the whole unit, slice = numel), grid and positions cleared.
  const Metadata& meta() const { return meta_; }
  const GridMeta& grid() const { return grid_; }  // the grid it was saved on
  const std::string& dir() const { return dir_; }
  // How whole parameter `param` of whole unit `unit` was saved: tensor rank 0's part of it, with
  // its split (replicated, axis, blocks).
  const ParamMeta& saved_part(int unit, int param) const;
  // The fp32 master of whole unit `unit` (meta().units[unit].numel elements).
  void read_unit(int unit, float* master);
  // ... and its optimizer state: out[0] the master, out[k] moment k (as many as wanted).
  void read_unit(int unit, std::span<float* const> out);
  // The whole model as another grid cuts it: elements [begin, begin + len) of `part`, a unit of
  // the new grid's layout at tensor rank `tensor` of `tensors`, into out[k][0, len) as above
  // (padding past the unit's elements reads 0). Each parameter is matched by unit and name;
  // each of its elements is found in the whole tensor by the new cut (split_axis and
  // split_blocks, or replicated), and in the saved part that holds it by the old one. Only the
  // saved sections that overlap are read, one at a time. Errors name the parameter and both
  // grids (`tensors`: the new tensor size; `grid`: the new grid, for messages).
  void read_part(const UnitInfo& part, int tensor, int tensors, std::int64_t begin, std::int64_t len,
                 std::span<float* const> out, const std::string& grid);

 private:
  struct Source {  // where a whole parameter comes from: pipeline part, and unit and parameter there
    int pipeline = 0, unit = 0, param = 0;
  };

  std::string dir_;
  GridMeta grid_;
  Metadata meta_;
  const ParamMeta& part_param(const Source& s) const;  // tensor rank 0's part of it
  std::vector<std::vector<Source>> sources_;           // per whole unit, per parameter
  std::vector<std::unique_ptr<Reader>> readers_;       // per position, t + T x p
};

// The step directory for `tag` under `root`: "latest" follows the latest file; digits name a
// step. `root` may also be a step directory itself (then tag must be "latest").
std::string resolve(const std::string& root, const std::string& tag);
std::string read_latest(const std::string& root);  // the directory name latest points to

// Completes a checkpoint written into `tmp_dir` (files already fsync'd): directory fsync,
// rename to root/step_..., root fsync, latest update, then pruning of old ones. `fail_point`
// is called at each named point (tests stop the save there).
void commit(const std::string& root, const std::string& tmp_dir, std::int64_t step, int keep_last,
            void (*fail_point)(const char*));
// Prepares root for writing step `step`: creates it, removes leftovers of interrupted saves,
// checks the step is not the latest checkpoint already; returns the temporary directory.
// `who` names the caller in messages ("save_checkpoint", "reshard"). With refuse_older, a root
// that already holds a newer step is refused: latest would move back and the next save of the
// run that owns the root would replace its newer checkpoints (an offline tool's case; a run
// resumed from an older tag does abandon the newer ones on purpose).
std::string prepare(const std::string& root, std::int64_t step, const char* who, bool refuse_older = false);

// The lock file of a checkpoint root (see runtime/job_lock.hpp).
inline constexpr const char* kLockFile = "zero.lock";
// Locks `root` for this process until it exits: exclusive before writing (prepare takes it),
// shared for reading (a resume), so a second job is refused instead of deleting the first
// one's save in progress. `root` may be a step directory: its parent is locked then. Called by
// one process per job (rank 0): the root is one directory every rank sees. `kind` names the
// directory in the refusal ("checkpoint root", "run directory").
void lock_root(const std::string& root, bool exclusive, const char* kind = "checkpoint root");

// ---------------------------------------------------------------- shared by the format's files

namespace detail {

// What to do about a file that fails a check.
inline constexpr const char* kDamaged =
    "the checkpoint is damaged or incomplete: load an older one (zero-ckpt inspect <root> lists and verifies them)";
constexpr std::int64_t kMaxElements = std::int64_t{1} << 50;

[[noreturn]] void sys_fail(const std::string& what, const std::string& path, int err);
[[noreturn]] void file_fail(const std::string& path, const std::string& field, const std::string& problem);

inline void put32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint32_t get32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace detail

}  // namespace zero::ckpt
