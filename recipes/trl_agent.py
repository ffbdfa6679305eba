"""A TRL agent script: GRPOTrainer with a tool, an environment_factory whose methods are tools, and
rewards that read the environments. `python recipes/trl_agent.py` trains it with TRL;
`./remax run recipes/trl_agent.lua` runs this same file with remax (docs/environments.md, "From TRL").
"""
import os


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, such as (1 + 100) // 2

    Returns:
        Its value
    """
    return str(eval(expression, {"__builtins__": {}}, {}))


class GuessTheNumber:
    """The model finds a secret number from 1 to 100; each guess is told higher or lower."""

    def reset(self, secret, **kwargs) -> str:
        self.secret, self.guesses, self.solved = secret, 0, False
        return " You have 6 guesses."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: Your guess, from 1 to 100

        Returns:
            Higher, lower, or right
        """
        self.guesses += 1
        if number == self.secret:
            self.solved = True
            return "Right!"
        return "Higher." if number < self.secret else "Lower."


def solved_reward(environments, **kwargs) -> list[float]:
    """1 for a game won, less 0.1 for each guess after the first; 0 for a game lost."""
    return [max(0.0, 1.1 - 0.1 * env.guesses) if env.solved else 0.0 for env in environments]


def brevity_reward(completions, **kwargs) -> list[float]:
    """A little less for every 100 characters the model writes."""
    return [-0.01 * sum(len(m["content"]) for m in c if m["role"] == "assistant") / 100 for c in completions]


if __name__ == "__main__":
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    here = os.path.dirname(os.path.abspath(__file__))
    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        reward_funcs=[solved_reward, brevity_reward],
        train_dataset=load_dataset("json", data_files=os.path.join(here, "trl_agent.jsonl"), split="train"),
        tools=[calculator],
        environment_factory=GuessTheNumber,
        args=GRPOConfig(output_dir="trl_agent", max_tool_calling_iterations=6, max_completion_length=1024,
                        num_generations=4, learning_rate=1e-6),
    )
    trainer.train()
