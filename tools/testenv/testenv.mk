# Local control plane targets (included from the main Makefile).
#
# testenv        build kube-apiserver/-controller-manager/-scheduler/kubectl, etcd, kwok(ctl), Helm from
#                Go modules into $(TANDEM_TESTENV_CACHE) (idempotent) and install Prometheus (Debian)
# cluster-up     start the local cluster `$(CLUSTER_NAME)` (KWOK AMD GPU nodes + Prometheus)
# cluster-down   stop it and remove its state; nothing is left running
# cluster-status show components, nodes, GPUs, kubeconfig and Prometheus URL
#
# Knobs: CLUSTER_NAME (tandem), CLUSTER_NODES (4), CLUSTER_PRODUCT (MI325X), CLUSTER_ZONES
# (zone-a,zone-b), CLUSTER_LOAD_DELAY (0, seconds before a pod turns Ready), CLUSTER_ARGS (extra flags).
# The kubeconfig is written to $${TANDEM_CLUSTERS_DIR:-~/.tandem/clusters}/$(CLUSTER_NAME)/kubeconfig;
# export TANDEM_KUBECONFIG=<that path> to make the cluster tests reuse it.

PY ?= .venv/bin/python
TESTENV_DIR ?= tools/testenv
CLUSTER_NAME ?= tandem
CLUSTER_NODES ?= 4
CLUSTER_PRODUCT ?= MI325X
CLUSTER_ZONES ?= zone-a,zone-b
CLUSTER_LOAD_DELAY ?= 0
CLUSTER_ARGS ?=

.PHONY: testenv cluster-up cluster-down cluster-status

testenv: ## Build the local control plane binaries (Go modules) and install Prometheus; print their paths
	@start=$$(date +%s); \
	$(TESTENV_DIR)/build.sh && $(TESTENV_DIR)/prometheus.sh && \
	echo "[testenv] ready in $$(( $$(date +%s) - start )) s"

cluster-up: ## Start the local KWOK cluster with simulated AMD GPU nodes and Prometheus
	$(PY) -m tandem.cli dev cluster up --name $(CLUSTER_NAME) --nodes $(CLUSTER_NODES) \
		--product $(CLUSTER_PRODUCT) --zones $(CLUSTER_ZONES) --load-delay $(CLUSTER_LOAD_DELAY) $(CLUSTER_ARGS)

cluster-down: ## Stop the local cluster and remove its state
	$(PY) -m tandem.cli dev cluster down --name $(CLUSTER_NAME)

cluster-status: ## Show the local cluster's components, nodes, GPUs, kubeconfig and Prometheus URL
	$(PY) -m tandem.cli dev cluster status --name $(CLUSTER_NAME)
