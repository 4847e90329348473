// Package models holds the models meshrun trains, built on the sharded
// layers of package linear: the Megatron MLP block (MLP, mlp.go) and a
// tensor-parallel GPT (GPT, gpt*.go). A model plans its layers and the
// moves it runs itself (linear.PlannerFor, linear.Execute), computes what
// lies between its layers with the rank's kernels (GELU, layer norms,
// attention, its loss), updates its parameters, and lists them for
// checkpoints (linear.Param), which package linear saves and loads.
//
// Each model has the same shape: a config (MLPConfig, GPTConfig) that is
// checked and planned without allocating anything (PlanMLP, CheckMLP,
// PlanGPT: the parameters a checkpoint must hold), a constructor that
// builds one rank's share from a seed, the same global model on every mesh
// (NewMLP, NewGPT), and a training Step that returns the loss. Every tensor
// of a step lives on the rank's device; only the loss comes back.
package models
