//go:build !amd64

package main

func fmaLoop(n int) {}
