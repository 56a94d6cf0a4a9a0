//go:build tools

// Package tools pins etcd (the root package of go.etcd.io/etcd/server/v3 is its main).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
