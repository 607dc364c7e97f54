"""What a trainer meets: group-relative advantages, weight versions, the group stream, dataset
rows -> tasks (`datasets`), exports (`export`) and the trainer mappings (`trainers`)."""
