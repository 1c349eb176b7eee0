# Installs headers, libraries and a package config so that a user's project can do
#   find_package(zero)  and  target_link_libraries(app PRIVATE zero::zero)
include(CMakePackageConfigHelpers)

install(TARGETS zero EXPORT zeroTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The CUDA backend's library, beside libzero, which loads it from there when a job asks for
# backend: cuda. Nothing links it, so it is not part of the exported targets.
if(TARGET zero_cuda)
  install(TARGETS zero_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/libzero/include/zero DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT zeroTargets NAMESPACE zero:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zeroConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroConfig.cmake ${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

# pkg-config: <libdir>/pkgconfig/zero.pc, for projects built without CMake. Its paths are those
# of the prefix installed into, known only at install time (cmake --install --prefix), so the
# prefix is filled in then.
set(ZERO_PC_PREFIX "@ZERO_INSTALL_PREFIX@")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(ZERO_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(ZERO_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
set(ZERO_PC_DEFINES "")
if(ZERO_WITH_CUDA)
  set(ZERO_PC_DEFINES " -DZERO_WITH_CUDA=1")  # what zero::zero gives CMake users
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/zero.pc.in ${PROJECT_BINARY_DIR}/zero.pc.template @ONLY)
install(CODE "
  file(READ \"${PROJECT_BINARY_DIR}/zero.pc.template\" _zero_pc)
  string(REPLACE \"@ZERO_INSTALL_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" _zero_pc \"\${_zero_pc}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/pkgconfig/zero.pc\" \"\${_zero_pc}\")")
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/zero.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
