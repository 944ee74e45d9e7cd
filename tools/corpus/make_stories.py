#!/usr/bin/env python3
"""Writes configs/corpus/stories.txt: short English stories from a small grammar.

The default training job needs text the repository may carry; this makes it instead of
copying someone's. The stories have real structure for a byte-level model to learn (spelling,
agreement, recurring names and story shapes) and are deterministic: the same seed gives the
same bytes. Standard library only; not part of the build.

    python3 tools/corpus/make_stories.py [--bytes N] [--seed S] [--out PATH]
"""
import argparse
import random

NAMES = ["Mia", "Tom", "Lena", "Sam", "Ada", "Ben", "Ivy", "Max", "Zoe", "Leo", "Nora", "Eli"]
ANIMALS = ["cat", "dog", "fox", "owl", "frog", "bird", "mouse", "rabbit", "bear", "duck"]
THINGS = ["ball", "kite", "book", "box", "hat", "key", "map", "boat", "cake", "lamp", "drum"]
COLORS = ["red", "blue", "green", "yellow", "small", "big", "old", "new", "shiny", "soft"]
PLACES = ["the park", "the garden", "the forest", "the river", "the hill", "the market",
          "the beach", "the kitchen", "the old barn", "the school"]
FEELINGS = ["happy", "sad", "tired", "brave", "curious", "scared", "proud", "hungry"]
TIMES = ["One day", "In the morning", "After lunch", "Later that day", "At night", "On Sunday"]
VERBS_PAST = ["found", "lost", "saw", "wanted", "carried", "painted", "hid", "shared"]


def a(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def story(rng):
    hero = rng.choice(NAMES)
    friend = rng.choice([n for n in NAMES if n != hero])
    animal = rng.choice(ANIMALS)
    thing = rng.choice(THINGS)
    color = rng.choice(COLORS)
    place = rng.choice(PLACES)
    other_place = rng.choice([p for p in PLACES if p != place])
    feeling = rng.choice(FEELINGS)
    lines = [
        f"{rng.choice(TIMES)}, {hero} went to {place} with {a(animal)}.",
        f"{hero} {rng.choice(VERBS_PAST)} {a(color + ' ' + thing)} near a tree.",
        f"The {animal} was {feeling}, so {hero} gave it the {thing}.",
    ]
    if rng.random() < 0.6:
        lines.append(f"Then {friend} came and asked, \"Can I play with the {thing} too?\"")
        lines.append(f"\"Yes,\" said {hero}. \"We can share it at {other_place}.\"")
    if rng.random() < 0.5:
        count = rng.randint(2, 9)
        lines.append(f"They counted {count} {thing}s and {count + 1} {animal}s on the way.")
    ending = rng.choice([
        f"At the end of the day, {hero} was {rng.choice(FEELINGS)} and went home.",
        f"The {animal} and {hero} became good friends.",
        f"{friend} said thank you, and everyone was {rng.choice(FEELINGS)}.",
        f"{hero} put the {thing} back in the box and went to sleep.",
    ])
    lines.append(ending)
    return " ".join(lines) + "\n\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", default="configs/corpus/stories.txt")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    parts, size = [], 0
    while size < args.bytes:
        text = story(rng)
        parts.append(text)
        size += len(text)
    with open(args.out, "w", encoding="ascii") as out:
        out.write("".join(parts))


if __name__ == "__main__":
    main()
