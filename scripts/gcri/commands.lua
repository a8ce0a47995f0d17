-- The GCRI command of the moongraph executable (see moongraph.commands).
return {
  gcri = { summary = "run the GCRI multi-branch workflow on a task", module = "scripts.gcri.cli" },
}
