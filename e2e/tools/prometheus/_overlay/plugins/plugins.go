// The service discovery compiled into the dev cluster's Prometheus: Kubernetes only, the one the
// Prometheus Operator's generated configuration uses (file and HTTP come from the module's minimum.go),
// as Prometheus's plugins.yml selects them at compile time. build.sh puts this file in place of the
// module's plugins/plugins.go (go build -overlay); the module's list compiles every cloud's SDK.

package plugins

import (
	_ "github.com/prometheus/prometheus/discovery/kubernetes" // Register kubernetes plugin.
)
