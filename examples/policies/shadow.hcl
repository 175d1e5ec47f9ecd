# Shadow mode: the default KV-aware policy decides every request, and the
# template plugin's queue-depth scorer (cmd/plugin-example) is asked beside
# it on every decision, never acted on. The router counts how often the
# trial agrees with the live choice (switchyard_shadow_decisions_total in
# serve, "shadow agree" in replay), how long it takes and how often it
# fails, so an operator can watch a new plugin on production traffic before
# switching to it: docs/policy-file.md, "Shadow mode". Build the plugin
# first: `make build` puts it in bin/.
router {
  block_size = 512
  seed       = 7
}

plugin "example" {
  command = "bin/plugin-example"
}

policy "live" {
  scorer "cost" {
    type = "kv-cost"
  }
  picker "pick" {
    type = "min-cost"
  }
  # Asked on every decision of the roles that select "live"; never acted on.
  shadow = "trial"
}

# The candidate policy: a policy like any other (not a picker type), with
# instances of its own for each role that selects "live".
policy "trial" {
  scorer "depth" {
    type           = "queue-depth" # declared by plugin "example"
    waiting_weight = 1.0
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "live"
}
