# Copies the shared libraries an executable needs into a folder, except glibc's own and the CUDA driver and
# NVRTC (the GPU machine brings those). CMakeLists.txt's gpu-bundle/ rule runs it for the qrig binary, whose
# libraries (fmt, toml++, cpp-httplib and its TLS/compression libraries, PCRE2, utf8proc, libstdc++) the GPU
# machine's image may lack; tests/gpu/run.sh points LD_LIBRARY_PATH at that folder for qrig only.
#   cmake -DEXE=<executable> -DDEST=<folder> -P bundle_deps.cmake
if(NOT EXE OR NOT DEST)
  message(FATAL_ERROR "usage: cmake -DEXE=file -DDEST=dir -P bundle_deps.cmake")
endif()
file(GET_RUNTIME_DEPENDENCIES EXECUTABLES ${EXE}
     RESOLVED_DEPENDENCIES_VAR deps UNRESOLVED_DEPENDENCIES_VAR missing
     PRE_EXCLUDE_REGEXES "^ld-linux" "^linux-vdso" "^libc\\.so" "^libm\\.so" "^libdl\\.so" "^libpthread\\.so"
                         "^librt\\.so" "^libutil\\.so" "^libresolv\\.so" "^libnvrtc" "^libcuda\\.so")
if(missing)
  message(FATAL_ERROR "${EXE} needs libraries this machine lacks: ${missing}")
endif()
file(MAKE_DIRECTORY ${DEST})
# Each library as a plain file under the name the loader asks for (the symlink's name, its soname).
foreach(lib IN LISTS deps)
  get_filename_component(name ${lib} NAME)
  file(COPY_FILE ${lib} ${DEST}/${name})
endforeach()
