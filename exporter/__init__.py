"""`optimum-cli export neuron`: arguments -> NeuronConfig -> export -> atomic write."""
