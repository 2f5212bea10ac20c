# zoo: source https://github.com/karpathy/minGPT mingpt/__init__.py at commit 37baab71b9abea1b76ab957409a1cc2fbfba8a26
# zoo: kept as its authors wrote it; every line changed for an offline CPU run says "# zoo:"
