# cmake -P script: installs the build into a scratch prefix and runs the installed programs from
# there, with nothing pointing back at the build tree: they must find libzero through their own
# RPATH ($ORIGIN/../lib) and the corpus and configs under <prefix>/share/zero.
#   -DBUILD_DIR=... -DPREFIX=... -DWORK=...
include(${CMAKE_CURRENT_LIST_DIR}/script_checks.cmake)

file(REMOVE_RECURSE ${PREFIX} ${WORK})
file(MAKE_DIRECTORY ${WORK})
zero_run("install" COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
# Not the build tree's libraries: a loader path would hide a missing RPATH.
set(ENV{LD_LIBRARY_PATH} "")

zero_run("zero-gpt --help" COMMAND ${PREFIX}/bin/zero-gpt --help)
zero_expect("--config")
zero_expect("eval_sequences")
zero_run("zero-mlp --help" COMMAND ${PREFIX}/bin/zero-mlp --help)
zero_expect("--steps")
zero_run("zero-ckpt --help" COMMAND ${PREFIX}/bin/zero-ckpt --help)
zero_run("zero-plot --help" COMMAND ${PREFIX}/bin/zero-plot --help)
zero_expect("metrics.jsonl")

# Two steps of the installed tiny config on the installed corpus.
zero_run("installed zero-gpt run" COMMAND ${PREFIX}/bin/zero-gpt --config ${PREFIX}/share/zero/gpt/configs/tiny.yaml
         --set run.steps=2 --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2
         --set train_micro_batch_size_per_gpu=2
         --set scheduler.params.warmup_num_steps=1 --set run.eval_sequences=4
         --set run.sample_tokens=0 --set run.peak_tflops=1 --set run.out_dir=${WORK}/run)
zero_expect("share/zero/data/tinyshakespeare.txt")
zero_expect("done: 2 steps")
zero_run("installed zero-mlp run" COMMAND ${PREFIX}/bin/zero-mlp --config ${PREFIX}/share/zero/mlp/mlp.yaml --steps 2)
zero_expect("step   2")
