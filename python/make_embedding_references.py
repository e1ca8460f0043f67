#!/usr/bin/env python3
"""sentence-transformers' embeddings of a varied corpus: the reference for splitflow's real
embedding models (issue 28, item 3). Run by hand where sentence-transformers is installed:

    python3 python/make_embedding_references.py --model .cache/models/all-MiniLM-L6-v2 \\
        --out tests/fixtures/encoder/all-minilm-l6-v2.reference.safetensors

Writes tests/fixtures/encoder/corpus.json (the texts, rewritten whole each run) and, for the
model, a safetensors file with
  embeddings  float32 [N, dim]  SentenceTransformer.encode (the model's own pooling and Normalize)
  tokens      int32 [total]     the ids sentence-transformers fed the model (its tokenizer, its
                                truncation at max_seq_length), every text's concatenated
  offsets     int32 [N + 1]     text i's ids are tokens[offsets[i]:offsets[i+1]]
on the CPU in fp32. metadata: the package versions and max_seq_length.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import safetensors.numpy
import sentence_transformers
import torch
import transformers

REPO = Path(__file__).resolve().parent.parent

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The cat sits outside",
    "The new movie is awesome",
    "The new movie is so great",
    "Do you like pizza?",
    "I love pasta!",
    "How do I reset my password?",
    "Forgot password: click the link in the e-mail we sent you.",
    "The quick brown fox jumps over the lazy dog.",
    "PACK MY BOX WITH FIVE DOZEN LIQUOR JUGS",
    "what is the capital of france",
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower was completed in 1889.",
    "Water boils at 100 degrees Celsius at sea level.",
    "E = mc^2 relates energy and mass.",
    "The derivative of sin(x) is cos(x).",
    "Photosynthesis converts light energy into chemical energy.",
    "Mitochondria are the powerhouse of the cell.",
    "DNA is a double helix.",
    "The stock market fell 3.2% on Tuesday after the announcement.",
    "Interest rates were left unchanged at 5.25%.",
    "Bitcoin's price hit $69,000 in November 2021.",
    "Order #4521 shipped on 2024-03-15 via UPS.",
    "Call me at +1 (555) 010-9999 or e-mail jane.doe@example.com.",
    "Visit https://www.example.org/docs?page=2&lang=en for details.",
    "def add(a, b):\n    return a + b",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "git commit -m \"Fix the off-by-one error\"",
    "{\"key\": \"value\", \"list\": [1, 2, 3]}",
    "<div class=\"header\">Hello</div>",
    "café naïve résumé façade coöperate",
    "Crème brûlée is a French dessert.",
    "Straße, Größe, Mädchen und Übermut",
    "¿Dónde está la biblioteca?",
    "Ceci n'est pas une pipe.",
    "Привет, как дела?",
    "Γειά σου Κόσμε",
    "我爱自然语言处理。",
    "東京は日本の首都です。",
    "서울은 대한민국의 수도이다.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "I'm so happy today 😊🎉",
    "🙂🙂🙂",
    "Thumbs up 👍🏽 and a family 👨‍👩‍👧‍👦",
    "Ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ ａｎｄ ＡＢＣ",
    "tab\tseparated\tvalues",
    "line one\nline two\nline three",
    "   leading and trailing spaces   ",
    "non\u00a0breaking\u00a0spaces",
    "zero\u200bwidth\u200bspace",
    "control\u0007char and\u0000nul",
    "",
    "a",
    "?",
    "...",
    "!!!???",
    "1234567890",
    "3.14159265358979323846",
    "The year 2000 problem (Y2K)",
    "COVID-19 vaccines were rolled out in 2021.",
    "state-of-the-art, well-known, mother-in-law",
    "U.S.A., e.g., i.e., etc.",
    "don't won't can't shouldn't y'all",
    "ALL CAPS SENTENCE ABOUT NOTHING",
    "MiXeD cAsE tExT",
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a lung disease.",
    "The patient presented with acute myocardial infarction.",
    "Take two tablets by mouth every 6 hours as needed for pain.",
    "The defendant pleaded not guilty to all charges.",
    "This agreement shall be governed by the laws of the State of New York.",
    "Once upon a time, in a land far, far away, there lived a king.",
    "It was the best of times, it was the worst of times.",
    "To be, or not to be, that is the question.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
    "The sun rises in the east and sets in the west.",
    "Rain is expected tomorrow with temperatures around 15°C.",
    "The train to Boston departs at 7:45 a.m. from platform 9¾.",
    "Please turn off your phones during the presentation.",
    "Our quarterly revenue grew by 12 percent year over year.",
    "The recipe calls for 2 cups of flour and 1 tsp of salt.",
    "Preheat the oven to 350°F (175°C).",
    "How many legs does a spider have?",
    "Spiders have eight legs.",
    "Which planet is known as the Red Planet?",
    "Mars is often called the Red Planet.",
    "The Great Wall of China is visible from low Earth orbit under certain conditions.",
    "Neural networks learn representations from data.",
    "Transformers use self-attention to model dependencies between tokens.",
    "Sentence embeddings map text to dense vectors.",
    "Cosine similarity measures the angle between two vectors.",
    "The model was trained on a billion sentence pairs.",
    "Retrieval-augmented generation combines search with language models.",
    "I need a vacation.",
    "Can you recommend a good book?",
    "The meeting has been moved to Thursday.",
    "Happy birthday! 🎂",
    "Thanks for your help, I really appreciate it.",
    "This product broke after two days. Terrible quality.",
    "Absolutely love it, five stars!",
    "Meh. It's okay, I guess.",
    "Customer support never answered my ticket.",
    "The package arrived damaged.",
    "Where is the nearest hospital?",
    "How far is the moon from the earth?",
    "The moon is about 384,400 km from Earth.",
]


def long_texts():
    """Texts past the 128/256/512-token limits, so truncation is tested."""
    paragraph = ("Language models read text as tokens; a long document is cut at the model's limit, "
                 "keeping its first tokens and the closing special token. ")
    return [paragraph * 12, " ".join(f"word{i}" for i in range(400)), "x " * 700]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    corpus = SENTENCES + long_texts()
    (REPO / "tests/fixtures/encoder/corpus.json").write_text(json.dumps(corpus, ensure_ascii=False, indent=1) + "\n")

    model = sentence_transformers.SentenceTransformer(str(args.model), device="cpu")
    embeddings = model.encode(corpus, batch_size=16, convert_to_numpy=True).astype(np.float32)
    tokens, offsets = [], [0]
    for text in corpus:
        features = model.tokenize([text])
        ids = features["input_ids"][0][features["attention_mask"][0].bool()].numpy().astype(np.int32)
        tokens.extend(ids.tolist())
        offsets.append(len(tokens))
    safetensors.numpy.save_file(
        {"embeddings": embeddings, "tokens": np.array(tokens, dtype=np.int32), "offsets": np.array(offsets, dtype=np.int32)},
        str(args.out),
        metadata={"sentence_transformers": sentence_transformers.__version__, "transformers": transformers.__version__,
                  "torch": torch.__version__, "max_seq_length": str(model.max_seq_length)})
    print(f"{args.out}: {len(corpus)} texts, dim {embeddings.shape[1]}, {len(tokens)} tokens, "
          f"max_seq_length {model.max_seq_length}")


if __name__ == "__main__":
    main()
