"""Development tools. `model_server`: the stand-in vLLM-compatible model server (tests, demo,
`polar-mq up` without an upstream). Production code never imports it (the import contract in
.importlinter says so)."""
