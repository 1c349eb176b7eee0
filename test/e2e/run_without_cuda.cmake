# cmake -P script: a CUDA build's libzero on a machine without the CUDA runtime. libzero must not
# need a CUDA library (readelf), and with the CUDA libraries out of the loader's reach a program
# linked against it trains on the host backend, on 1 and 2 ranks, with the losses of an ordinary
# run, while backend: cuda fails with one error naming the CUDA backend's library and what the
# loader missed. The GPT trainer, whose CUDA operations are a library of their own too, trains
# on the host the same way.
#   -DLIBZERO=... -DPLUGIN=<libzero_cuda> -DPROGRAM=<zero-mlp> -DCONFIG=<mlp.yaml> -DWORK=...
#   -DMPIEXEC=... -DMPIEXEC_FLAGS=<flags separated by |>
#   -DGPT=<zero-gpt> -DGPT_PLUGIN=<libzero_gpt_cuda> -DGPT_CONFIG=<tiny.yaml>
#
# Hiding the CUDA libraries: the programs and libzero's libraries are copied into WORK without
# their RPATHs and run by the dynamic loader with --inhibit-cache (no /etc/ld.so.cache, where the
# toolkit's folder is usually listed) and --library-path WORK/lib: only the system folders and
# WORK/lib are searched, so libcudart, libnccl and libcublasLt cannot be found.
include(${CMAKE_CURRENT_LIST_DIR}/script_checks.cmake)

# zero-mlp's "step N  loss X" lines, in order.
function(losses out_var)
  string(REGEX MATCHALL "step +[0-9]+  loss [0-9.e+-]+" lines "${last_out}")
  set(${out_var} "${lines}" PARENT_SCOPE)
endfunction()

string(REPLACE "|" ";" MPIEXEC_FLAGS "${MPIEXEC_FLAGS}")
set(steps 20)
set(mlp ${WORK}/bin/zero-mlp --config ${CONFIG} --steps ${steps})

# 1. What the libraries and programs ask the loader for.
foreach(file ${LIBZERO} ${PROGRAM} ${GPT})
  execute_process(COMMAND readelf -d ${file} OUTPUT_VARIABLE dyn COMMAND_ERROR_IS_FATAL ANY)
  if(dyn MATCHES "NEEDED[^\n]*(libcuda|libcudart|libnccl|libcublas)[^\n]*")
    message(FATAL_ERROR "${file} needs a CUDA library:\n${CMAKE_MATCH_0}\n${dyn}")
  endif()
endforeach()
execute_process(COMMAND readelf -d ${PLUGIN} OUTPUT_VARIABLE plugin_dyn COMMAND_ERROR_IS_FATAL ANY)
if(NOT plugin_dyn MATCHES "NEEDED[^\n]*libcudart")
  message(FATAL_ERROR "the CUDA backend's library does not need libcudart; this test would prove nothing:\n"
                      "${plugin_dyn}")
endif()
execute_process(COMMAND readelf -l ${PROGRAM} OUTPUT_VARIABLE headers COMMAND_ERROR_IS_FATAL ANY)
if(NOT headers MATCHES "program interpreter: ([^]\n]+)\\]")
  message(FATAL_ERROR "no program interpreter in ${PROGRAM}:\n${headers}")
endif()
set(loader ${CMAKE_MATCH_1})

# 2. A folder with the programs and libraries, nothing pointing elsewhere.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/bin ${WORK}/lib)
foreach(lib ${LIBZERO} ${PLUGIN} ${GPT_PLUGIN})
  execute_process(COMMAND readelf -d ${lib} OUTPUT_VARIABLE dyn COMMAND_ERROR_IS_FATAL ANY)
  if(NOT dyn MATCHES "SONAME[^\n]*\\[([^]\n]+)\\]")
    message(FATAL_ERROR "${lib} has no SONAME")
  endif()
  file(COPY_FILE ${lib} ${WORK}/lib/${CMAKE_MATCH_1})
  file(RPATH_REMOVE FILE ${WORK}/lib/${CMAKE_MATCH_1})
endforeach()
foreach(program ${PROGRAM} ${GPT})
  get_filename_component(name ${program} NAME)
  file(COPY_FILE ${program} ${WORK}/bin/${name})
  file(RPATH_REMOVE FILE ${WORK}/bin/${name})
endforeach()
set(hidden ${loader} --inhibit-cache --library-path ${WORK}/lib)

# 3. The ordinary run (build tree, CUDA within reach), whose losses the hidden runs must repeat.
zero_run("zero-mlp" COMMAND ${PROGRAM} --config ${CONFIG} --steps ${steps})
losses(reference)
list(LENGTH reference n)
if(NOT n EQUAL steps)
  message(FATAL_ERROR "expected ${steps} loss lines, got ${n}:\n${last_out}")
endif()
list(GET reference 0 first)
list(GET reference -1 last)
string(REGEX REPLACE ".*loss " "" first "${first}")
string(REGEX REPLACE ".*loss " "" last "${last}")
if(NOT last LESS first)
  message(FATAL_ERROR "zero-mlp did not train: loss ${first} -> ${last}")
endif()

# 4. backend: cuda with CUDA hidden: the error names the library and the missing CUDA runtime
# (which also shows that the hiding works).
zero_run("backend: cuda without the CUDA runtime" FAILS COMMAND ${hidden} ${mlp} --set backend=cuda)
zero_expect("libzero_cuda.so")
zero_expect("could not be loaded")
zero_expect("libcudart")
zero_expect("backend: host")

# 5. The host backend with CUDA hidden, on 1 and 2 ranks: the same losses.
zero_run("zero-mlp, CUDA hidden" COMMAND ${hidden} ${mlp})
losses(got)
if(NOT got STREQUAL reference)
  message(FATAL_ERROR "losses differ with CUDA hidden:\n${got}\nvs\n${reference}")
endif()
zero_run("zero-mlp, CUDA hidden, 2 ranks" COMMAND ${MPIEXEC} ${MPIEXEC_FLAGS} -n 2 ${hidden} ${mlp})
zero_expect("2 ranks")
losses(got2)
list(LENGTH got2 n2)
if(NOT n2 EQUAL steps)
  message(FATAL_ERROR "expected ${steps} loss lines on 2 ranks, got ${n2}:\n${last_out}")
endif()

# 6. Two steps of a small GPT with CUDA hidden.
zero_run("zero-gpt, CUDA hidden" COMMAND ${hidden} ${WORK}/bin/zero-gpt --config ${GPT_CONFIG}
         --set run.steps=2 --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2
         --set train_micro_batch_size_per_gpu=2 --set scheduler.params.warmup_num_steps=1
         --set run.eval_sequences=4 --set run.sample_tokens=0 --set run.peak_tflops=1
         --set run.out_dir=${WORK}/gpt-run)
zero_expect("done: 2 steps")

message(STATUS "trained without the CUDA libraries: ${first} -> ${last}")
