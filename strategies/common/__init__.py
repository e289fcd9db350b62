"""What several methods share: the federation, role-wise FedAvg rounds, model states and updates."""
