# cmake -DDIR=<folder> -P CheckEmptyFolder.cmake: fails, naming what is there,
# unless DIR is empty (or absent); then empties it for the next run.
file(GLOB leftovers LIST_DIRECTORIES true "${DIR}/*" "${DIR}/.*")
if(leftovers)
  list(LENGTH leftovers count)
  list(SUBLIST leftovers 0 20 shown)
  file(REMOVE_RECURSE ${leftovers})
  string(REPLACE ";" "\n  " shown "${shown}")
  message(FATAL_ERROR "the tests left ${count} file(s) or folder(s) in their TMPDIR ${DIR} (removed now):\n  ${shown}")
endif()
