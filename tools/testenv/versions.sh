# Pinned versions of the local control plane (sourced by build.sh; read by tandem.devcluster).
# A bump here rebuilds only the component whose version changed, into a new cache folder.
K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.14
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4
