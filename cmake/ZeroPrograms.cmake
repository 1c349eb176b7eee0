# zero_install_program(<target>): installs a program into <prefix>/bin so that it finds
# libzero in <prefix>/lib wherever the tree is installed or moved: the installed binary carries
# an RPATH relative to itself ($ORIGIN/../lib), not the build tree's absolute one.
function(zero_install_program target)
  file(RELATIVE_PATH to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${to_lib}")
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()
