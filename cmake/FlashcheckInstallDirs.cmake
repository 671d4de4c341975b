# Where `cmake --install` puts things (GNU layout under the prefix). Included
# before the libraries, since the CLI compiles in where its report.py lies
# relative to its own binary; the install rules are in FlashcheckInstall.cmake.
#
#   <prefix>/bin/flashcheck
#   <prefix>/include/flashcheck/<lib>/...            every exported library's public headers
#   <prefix>/lib/libflashcheck_<lib>.a
#   <prefix>/lib/cmake/flashcheck/                   flashcheckConfig.cmake, its version file, the targets
#   <prefix>/share/flashcheck/reports/report.py      (and the modules and templates beside it)
#   <prefix>/share/flashcheck/docs/record.schema.json   (report.py reads ../docs/ from its own folder)
include(GNUInstallDirs)
set(FLASHCHECK_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flashcheck" CACHE STRING
    "Where flashcheckConfig.cmake is installed (relative to the prefix)")
set(FLASHCHECK_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/flashcheck")
# report.py relative to the binary's folder (../share/flashcheck/reports/report.py
# in the GNU layout): the CLI finds it from /proc/self/exe (cli/report.cpp), so
# an installed tree can be moved, and a build tree's binary falls back to the
# source tree's copy.
file(RELATIVE_PATH FLASHCHECK_INSTALLED_REPORT_SCRIPT "/prefix/${CMAKE_INSTALL_BINDIR}"
     "/prefix/${FLASHCHECK_INSTALL_DATADIR}/reports/report.py")
