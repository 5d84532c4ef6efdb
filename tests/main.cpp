// Catch2 main for every test binary (one per area, see CMakeLists.txt).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
