"""A real parameter-server run of a ``family: recommendation`` plan on torch.distributed (gloo, CPU).

Roles, as ps-lite and MindSpore's parameter server name them (Li et al. 2014, "Scaling Distributed
Machine Learning with the Parameter Server", OSDI, section 3; MindSpore's MS_SCHED / MS_PSERVER /
MS_WORKER): the scheduler is the launcher's TCPStore (rendezvous and membership), servers hold
their shards of the server tensors and apply the optimizer to what the workers push, workers pull
the rows and weights they need, compute forward and backward and push the gradients. In hybrid
mode the tensors left off the servers are replicated on the workers and all-reduced among them.

Modules: config (plan -> PsConfig, --tiny), model (the DLRM / Wide&Deep network as a function of
its tensors, data, init, optimizers, the single-process reference), wire (point-to-point messages),
server, worker, node (the process entry point), launch (the scheduler), report.
Like the rest of advisor.executor this package reads only the plan JSON: no cost model, no search.
"""
