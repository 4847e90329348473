//go:build cuda

package catalog

func init() { tagged["cuda"] = true }
