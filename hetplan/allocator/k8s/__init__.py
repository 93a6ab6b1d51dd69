"""Everything Kubernetes: objects and quantities, the scheduler extender, the node sync, the controller.

The allocator core (`hetplan.allocator.core` and what it imports) imports nothing from here; this package imports
the core. The kubernetes client itself is imported only where a module talks to an API server, when it does.

- `extender`: v1.Pod / v1.Node as hetplan reads them, bounded quantities (`parse_quantity`), a pod's job class
  (`pod_class`), and kube-scheduler's extender verbs (`filter_nodes`, `score_nodes`).
- `nodes`: the node sync (`NodeSync`: list + watch Nodes into the allocator; `load_client` for a kubeconfig).
- `pods`: opted-in pods: their job id, own request, and the patches that give them an allocation.
- `webhook`: the mutating admission webhook (AdmissionReview v1) that sets an opted-in pod's allocation.
- `lease`: leader election on a coordination.k8s.io Lease.
- `controller`: `hetplan controller`: follows the allocator's action log and applies it to the pods.
"""
