//go:build tools

// Package tools pins Flux's source-controller, which serves the tests' git repositories to
// kustomize-controller as artifacts.
package tools

import (
	_ "github.com/fluxcd/source-controller"
)
