# zero_install_program(<target>): installs a program into <prefix>/bin so that it finds
# libzero in <prefix>/lib wherever the tree is installed or moved: the installed binary carries
# an RPATH relative to itself ($ORIGIN/../lib), not the build tree's absolute one.
function(zero_install_program target)
  file(RELATIVE_PATH to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${to_lib}")
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  zero_uses_backends(${target})
endfunction()

# zero_uses_backends(<target>): a program that may run backend: cuda builds the libraries loaded
# for it (libzero_cuda; libzero_gpt_cuda, the GPT model's CUDA operations) with it. They are
# loaded at run time, so no link says so.
function(zero_uses_backends target)
  foreach(library zero_cuda zero_gpt_cuda)
    if(TARGET ${library})
      add_dependencies(${target} ${library})
    endif()
  endforeach()
endfunction()
