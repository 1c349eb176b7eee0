# cmake -P script: installs the build into a scratch prefix and runs the installed programs from
# there, with nothing pointing back at the build tree: they must find libzero through their own
# RPATH ($ORIGIN/../lib) and the corpus and configs under <prefix>/share/zero.
#   -DBUILD_DIR=... -DPREFIX=... -DWORK=...
function(run_ok what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${WORK})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()
function(expect text)
  string(FIND "${last_out}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in:\n${last_out}")
  endif()
endfunction()

file(REMOVE_RECURSE ${PREFIX} ${WORK})
file(MAKE_DIRECTORY ${WORK})
run_ok("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
# Not the build tree's libraries: a loader path would hide a missing RPATH.
set(ENV{LD_LIBRARY_PATH} "")

run_ok("zero-gpt --help" ${PREFIX}/bin/zero-gpt --help)
expect("--config")
expect("eval_sequences")
run_ok("zero-mlp --help" ${PREFIX}/bin/zero-mlp --help)
expect("--steps")
run_ok("zero-ckpt --help" ${PREFIX}/bin/zero-ckpt --help)
run_ok("zero-plot --help" ${PREFIX}/bin/zero-plot --help)
expect("metrics.jsonl")

# Two steps of the installed tiny config on the installed corpus.
run_ok("installed zero-gpt run" ${PREFIX}/bin/zero-gpt --config ${PREFIX}/share/zero/gpt/configs/tiny.yaml
       --set run.steps=2 --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2
       --set train_micro_batch_size_per_gpu=2
       --set scheduler.params.warmup_num_steps=1 --set run.eval_sequences=4
       --set run.sample_tokens=0 --set run.peak_tflops=1 --set run.out_dir=${WORK}/run)
expect("share/zero/data/tinyshakespeare.txt")
expect("done: 2 steps")
run_ok("installed zero-mlp run" ${PREFIX}/bin/zero-mlp --config ${PREFIX}/share/zero/mlp/mlp.yaml --steps 2)
expect("step   2")
