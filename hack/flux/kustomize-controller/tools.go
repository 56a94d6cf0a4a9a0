//go:build tools

// Package tools pins Flux's kustomize-controller, which applies the tests' Kustomizations
// (server-side apply, prune, health checks with kstatus) to the dev control plane.
package tools

import (
	_ "github.com/fluxcd/kustomize-controller"
)
