"""Models, datasets and losses written the way users outside polytrain write them (torchvision's
ResNet, nanoGPT's GPT, plain factories), for the bring-your-own tests. Not copied: written here."""
